"""What an operator needs on the REST server of `tfra-de serve`, added to any aiohttp app (e.g.
`rest.make_app`'s) without touching its handlers:

    GET /healthz                          liveness: 200 "ok" while the process serves
    GET /monitoring/prometheus/metrics    Prometheus metrics (inference/metrics.py; TF Serving's
                                          path)

and a middleware that counts every request in the metrics (api "rest:predict", "rest:status",
..., code the HTTP status) and writes it to the access log (inference/access_log.py).

Example:
    >>> from aiohttp import web
    >>> from tfra_dynamic_embedding.inference import metrics as metrics_lib
    >>> app = web.Application()
    >>> instrument(app, "m", metrics_lib.ServingMetrics(), access_log=None)
    >>> sorted({route.resource.canonical for route in app.router.routes()})
    ['/healthz', '/monitoring/prometheus/metrics']
"""

import time

from aiohttp import web

from tfra_dynamic_embedding.inference import metrics as metrics_lib

HEALTH_PATH = "/healthz"


def api_of(request):
    """The `api` label of a REST request: "rest:predict", "rest:status", ..."""
    path = request.path
    if path.endswith(":predict"):
        return "rest:predict"
    if path.startswith("/v1/models/"):
        return "rest:metadata" if path.endswith("/metadata") else "rest:status"
    if path == HEALTH_PATH:
        return "rest:health"
    if path == metrics_lib.PATH:
        return "rest:metrics"
    return "rest:other"


def instrument(app, model_name, metrics=None, access_log=None):
    """Adds the routes above (the metrics route only with `metrics`) and the middleware to
    `app` (before it starts)."""

    @web.middleware
    async def observe(request, handler):
        began, status = time.monotonic(), 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as error:   # e.g. aiohttp's own 404 / 405
            status = error.status
            raise
        finally:
            seconds = time.monotonic() - began
            if metrics is not None:
                metrics.request(model_name, api_of(request), status, seconds)
            if access_log is not None:
                access_log.write("rest", f"{request.method} {request.path_qs}", status, seconds,
                                 peer=request.remote or "")

    async def health(_request):
        return web.Response(text="ok\n")

    async def scrape(_request):
        return web.Response(body=metrics.exposition(),
                            headers={"Content-Type": metrics_lib.CONTENT_TYPE})

    if metrics is not None or access_log is not None:
        # Outermost: it sees the status the JSON-error middleware answers with.
        app.middlewares.insert(0, observe)
    app.router.add_get(HEALTH_PATH, health)
    if metrics is not None:
        app.router.add_get(metrics_lib.PATH, scrape)
