"""Sphinx configuration of the book, shared by both editions (`python -m tools.book` stages the sources).

The English edition builds from the committed notebooks; the Chinese one from the same notebooks
with their markdown taken from the zh_CN catalogs (`tools.book.i18n`), with `-D language=zh_CN`
for the theme's own words and the search's word splitting (jieba). Nothing is executed
(`nb_execution_mode = "off"`) and nothing is fetched: MathJax and the widget scripts are served
from `_static/vendor/`.
"""

import os

project = "Attention by Hand"
author = "the Attention by Hand team"
copyright = "2026, the Attention by Hand team"
language = "en"  # the Chinese edition overrides it with -D language=zh_CN

extensions = ["myst_nb"]
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints", "locale"]
suppress_warnings = ["myst.header"]  # a notebook may skip from # to ### (its cells stand alone)

# Notebooks: rendered as committed, outputs and saved widget state included.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "html_image"]
myst_heading_anchors = 3
# The widget scripts myst-nb would take from cdnjs / jsdelivr, served from the site instead.
nb_ipywidgets_js = {"vendor/require.js": {}, "vendor/embed-amd.js": {}}

# MathJax 2.7 from the jupyter-server-mathjax wheel, copied into _static/vendor/mathjax.
mathjax_path = "vendor/mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"
# Sphinx writes maths as \\( \\) and \\[ \\] inside elements of class "math"; myst-nb marks the
# rest of a notebook's page tex2jax_ignore, so a stray dollar in an output is never typeset.
mathjax2_config = {
    "tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]],
                "processEscapes": False, "processEnvironments": True, "processRefs": False,
                "processClass": "math|output_area", "ignoreClass": "tex2jax_ignore|mathjax_ignore"},
    # The wheel ships MathJax's STIX-Web fonts only; MathJax's probe for local fonts loads a blank
    # font from about:blank, which browsers refuse with a console error: an empty data: font instead.
    "HTML-CSS": {"availableFonts": [], "webFont": "STIX-Web", "imageFont": None,
                 "preferredFont": None,
                 "styles": {"@font-face": {"font-family": "MathJax_Blank",
                                           "src": "url('data:font/woff;base64,')"}}},
    "messageStyle": "none",
}
mathjax3_config = None

html_theme = "sphinx_book_theme"
html_title = "Attention by Hand"
html_static_path = ["_static"]
html_extra_path = ["_extra"]  # the widget fonts, where the widget script looks for them
html_context = {"default_mode": "auto"}  # light or dark as the reader's system prefers; the switch overrides
html_css_files = ["book.css"]
html_last_updated_fmt = None
html_copy_source = True  # the download button offers the page's notebook (the Chinese one in that edition)
html_show_sourcelink = False
# The search follows `language`: for zh_CN Sphinx splits words with jieba (requirements-dev.txt).

# Launch buttons open the lesson on the course's JupyterHub and on Binder (links only: nothing
# is requested until a reader clicks). The repository is the one the book was built from.
REPO = os.environ.get("BOOK_REPO_URL", "https://github.com/attention-by-hand/attention-by-hand")
HUB = os.environ.get("BOOK_HUB_URL", "http://localhost:8000")
html_theme_options = {
    "repository_url": REPO,
    "repository_branch": "main",
    "path_to_docs": "notebooks",
    "use_repository_button": True,
    "use_download_button": True,
    "launch_buttons": {
        "binderhub_url": "https://mybinder.org",
        "jupyterhub_url": HUB,
        "notebook_interface": "jupyterlab",
    },
    "show_navbar_depth": 1,
    "show_toc_level": 2,
    "home_page_in_toc": True,
}


def _chinese_stemmer(app, exception) -> None:
    """Sphinx 9.0.4's Chinese search sets `window.Stemmer = ChineseStemmer` but ships only
    english-stemmer.js (sphinx/search/zh.py: js_stemmer_rawcode, and get_js_stemmer_code in
    sphinx/search/__init__.py), so the search page throws and finds nothing: point it at the
    English stemmer it does ship (Latin words in Chinese text are stemmed as English, as intended)."""
    if exception is None and app.builder.format == "html" and app.config.language.startswith("zh"):
        path = os.path.join(app.outdir, "_static", "language_data.js")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace("window.Stemmer = ChineseStemmer;", "window.Stemmer = EnglishStemmer;"))


# Sphinx indexes Chinese as the words jieba cut at build time, but splits a query only at spaces
# and punctuation, so 因果掩码 (indexed as 因果 + 掩码) finds nothing. This splitter cuts a run of
# Chinese characters in the query into the longest words the index itself holds (forward maximum
# matching on Search._index.terms, loaded by the time a query runs); a lone character the index
# does not hold (的, 了) is dropped, since every term must match.
CHINESE_SPLITTER = """
var splitQuery = (query) => {
  const words = query.split(/[^\\p{Letter}\\p{Number}_\\p{Emoji_Presentation}]+/gu).filter((t) => t);
  const terms = (typeof Search !== "undefined" && Search._index) ? Search._index.terms : null;
  const out = [];
  for (const word of words) {
    if (!terms || !/[\\u3400-\\u9fff]/.test(word) || word in terms) { out.push(word); continue; }
    let i = 0;
    while (i < word.length) {
      let j = Math.min(word.length, i + 8);
      while (j > i + 1 && !(word.slice(i, j).toLowerCase() in terms)) j--;
      const piece = word.slice(i, j);
      if (piece.length > 1 || piece.toLowerCase() in terms) out.push(piece);
      i = j;
    }
  }
  return out;
};
"""


def setup(app):
    from sphinx.search import zh

    zh.SearchChinese.js_splitter_code = CHINESE_SPLITTER
    app.connect("build-finished", _chinese_stemmer)
