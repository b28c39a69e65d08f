"""The HTTP job API (issue 11): `python -m producer serve`. See producer/api/app.py."""

from producer.api.app import create_app

__all__ = ["create_app"]
