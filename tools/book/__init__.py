"""The series as a book in English and Chinese: `build` (Sphinx) and `i18n` (the catalogs)."""
