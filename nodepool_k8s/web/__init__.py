"""The status web app: the aiohttp server and its limits (app), the per-refresh snapshot every
answer shares (snapshot) and the HTML page (page).
"""
