"""Results: the claims and their verdicts, the rendering of tables (Markdown, CSV, LaTeX), and the report that
gathers the committed renderings into ``results/README.md``."""
