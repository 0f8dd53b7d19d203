"""Repository tools run from the root (installers, the site builder); not installed."""
