"""Django settings for outbox-lab's zoo entry of django-jaiminho 2.2.1: only what its
`events_relay` command needs. The database is outbox-lab's (OUTBOX_LAB_DATABASE_URL, taken
apart for Django's PostgreSQL backend on psycopg 3: the socket directory, the port, the
database, the user, and application_name=relay-N). Nothing is written to disk.

JAIMINHO_CONFIG (its README, "Configuration options"):
- PUBLISH_STRATEGY "keep-order": the transactional outbox of its README ("A separate command
  relayer will keep polling local DB and executing those functions in the same order it was
  stored"); every event is stored, the relay sends them all.
- SIGN_EVENTS / VERIFY_EVENTS_SIGNATURE off: the events are written by outbox-lab's writer in
  SQL (--insert-sql), which cannot compute Django's Signer HMAC; signing is a tamper check, not
  part of the delivery.
- DELETE_AFTER_SEND off (its default): a sent event is kept with sent_at set."""
import os
from urllib.parse import parse_qs, unquote, urlsplit

_url = urlsplit(os.environ["OUTBOX_LAB_DATABASE_URL"])
_query = {k: v[-1] for k, v in parse_qs(_url.query).items()}
# the host part as written (urlsplit's hostname lowercases it): a percent-encoded socket directory
_host = unquote(_url.netloc.rsplit("@", 1)[-1].rsplit(":", 1)[0]) or _query.get("host", "")

SECRET_KEY = "outbox-lab-zoo"
USE_TZ = True
INSTALLED_APPS = ["jaiminho"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
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
    "loggers": {"jaiminho": {"handlers": ["stderr"], "level": "WARNING"}},
}
JAIMINHO_CONFIG = {
    "PUBLISH_STRATEGY": "keep-order",
    "SIGN_EVENTS": False,
    "VERIFY_EVENTS_SIGNATURE": False,
    "DELETE_AFTER_SEND": False,
}
