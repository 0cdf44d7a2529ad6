"""The ASGI server: the app, authentication, limits and health routes."""
