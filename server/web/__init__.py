"""The web layer's bounds, between the network and the routes and sockets: who may change a
run, and what any one client may cost.

  deps.py            FastAPI dependencies: the app's parts, runs by id, authorize (the owner)
  auth.py            tokens: made, hashed, the page's storage key
  origin_check.py    state changes only from the app's own pages (Origin, Sec-Fetch-Site)
  limits.py          body sizes, upload and download timeouts, JSON reads per address
  uvicorn_limits.py  request-head timeout, connections per address (uvicorn's protocols)
  quotas.py          new runs, samples, metrics rate, trainer bytes, viewers and exports
"""
