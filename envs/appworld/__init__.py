"""AppWorld-v0: the AppWorld engine, in its own virtual environment, in sandboxed servers on Unix sockets.

Importing this package imports nothing, so `envs.appworld.synthetic` and `envs.appworld.server`
also run under the AppWorld venv's interpreter (pydantic 1, no gymnasium).
"""
