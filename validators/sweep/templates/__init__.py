"""jinja2 templates of generated sweep modules; a package so that they ship with the wheel."""
