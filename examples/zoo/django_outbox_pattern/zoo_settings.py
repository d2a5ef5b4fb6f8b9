"""Django settings for outbox-lab's zoo entry of django-outbox-pattern 3.2.1: only what its
`publish` command needs. The database is outbox-lab's (OUTBOX_LAB_DATABASE_URL, taken apart
for Django's PostgreSQL backend on psycopg 3: the socket directory, the port, the database, the
user, and application_name=relay-N); the broker connection is zoo_connection.SinkConnection
(the library's DEFAULT_CONNECTION_CLASS setting), which POSTs to outbox-lab's sink. Nothing is
written to disk: no SQLite, the cache is Django's default in-memory one."""
import os
from urllib.parse import parse_qs, unquote, urlsplit

_url = urlsplit(os.environ["OUTBOX_LAB_DATABASE_URL"])
_query = {k: v[-1] for k, v in parse_qs(_url.query).items()}
# the host part as written (urlsplit's hostname lowercases it): a percent-encoded socket directory
_host = unquote(_url.netloc.rsplit("@", 1)[-1].rsplit(":", 1)[0]) or _query.get("host", "")

SECRET_KEY = "outbox-lab-zoo"
USE_TZ = True
INSTALLED_APPS = ["django_outbox_pattern"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": _host,
        "PORT": str(_url.port or 5432),
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "OPTIONS": {"application_name": _query.get("application_name", "relay")},
    }
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_outbox_pattern": {"handlers": ["stderr"], "level": "INFO"}},
}
DJANGO_OUTBOX_PATTERN = {
    "DEFAULT_CONNECTION_CLASS": "zoo_connection.SinkConnection",
}
