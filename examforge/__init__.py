"""examforge: generate exam question banks with LLMs, resumable and exactly-once.

The domain core lives here (settings, syllabus, provider client, output validation, the
chapter pipeline); `storage` holds the database, `tasks` the Celery app, `producer` the CLI.
"""
