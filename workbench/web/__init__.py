"""``workbench web``: the TUI in a browser, served on loopback by ``textual-serve``.

``cli`` parses the command and checks the database; ``server`` is the web server (textual-serve's
aiohttp application with the Host/Origin checks of every workbench server and a cap on open
browser sessions); ``child`` is what each browser session runs: the TUI under Textual's web driver.
"""
