"""The page the plot scripts write: a chart (inline SVG) and a table, self-contained (no network),
written whole or not at all."""
import html
import os


def write_page(path, title, svg, table):
    """Writes <title>, the SVG elements and the table rows (lists of strings) to `path` atomically."""
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title>"
            "<style>body{font-family:sans-serif;margin:20px}td,th{padding:2px 10px;text-align:right}</style></head><body>"
            + "".join(svg) + "".join(table) + "</body></html>\n")
    with open(path + ".tmp", "w") as f:
        f.write(page)
    os.replace(path + ".tmp", path)
