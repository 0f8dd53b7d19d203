"""The course around the library: Try-it checks, graders' helpers, pictures."""
