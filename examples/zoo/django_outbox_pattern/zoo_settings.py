"""Minimal Django settings for running django-outbox-pattern's own `publish` command under
outbox-lab verify. The database comes from libpq's PG* variables that verify sets."""
import os
SECRET_KEY = "zoo"
USE_TZ = True
INSTALLED_APPS = ["django_outbox_pattern"]
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": os.environ.get("PGDATABASE", ""), "USER": os.environ.get("PGUSER", ""),
    "PASSWORD": os.environ.get("PGPASSWORD", ""), "HOST": os.environ.get("PGHOST", ""),
    "PORT": os.environ.get("PGPORT", ""),
    "OPTIONS": {"application_name": os.environ.get("OUTBOX_LAB_RELAY_NAME", "zoo")},
}}
DJANGO_OUTBOX_PATTERN = {
    # the library's one pluggable seam for the broker: a STOMP-connection-shaped class
    "DEFAULT_CONNECTION_CLASS": "zoo_connection.SinkConnection",
}
LOGGING = {"version": 1, "handlers": {"e": {"class": "logging.StreamHandler"}},
           "loggers": {"django_outbox_pattern": {"handlers": ["e"], "level": "INFO"}}}
