"""Repository rule `local_hiredis_repository`: hiredis (Debian's libhiredis-dev) for Bazel.

Generates a repository `@local_hiredis` with

    @local_hiredis//:defs.bzl    HIREDIS_AVAILABLE: whether hiredis' header is installed
    @local_hiredis//:hiredis     cc_library linking -lhiredis (only when it is)

The headers stay where the system keeps them (/usr/include/hiredis or /usr/local/include/hiredis,
both builtin include directories of Bazel's auto-configured C++ toolchain). Without them the Redis
op library is simply not declared (tools/bzl/defs.bzl), so `bazel test //...` keeps working on a
machine without hiredis (`make system-deps` installs it).
"""

_HEADERS = ["/usr/include/hiredis/hiredis.h", "/usr/local/include/hiredis/hiredis.h"]

def _local_hiredis_repository_impl(ctx):
    available = False
    for header in _HEADERS:
        if ctx.path(header).exists:
            available = True
            break
    build = 'package(default_visibility = ["//visibility:public"])\n'
    if available:
        build += 'cc_library(\n    name = "hiredis",\n    linkopts = ["-lhiredis"],\n)\n'
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD", build)
    ctx.file("defs.bzl", "HIREDIS_AVAILABLE = %s\n" % available)

local_hiredis_repository = repository_rule(
    implementation = _local_hiredis_repository_impl,
    local = True,
)
