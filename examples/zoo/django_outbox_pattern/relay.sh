#!/bin/sh
# django-outbox-pattern 3.2.1's own management command `publish`, unmodified (Producer.publish_message_from_database loop).
cd "$(dirname "$0")"
export DJANGO_SETTINGS_MODULE=zoo_settings PYTHONPATH="$(pwd)"
exec ../../venvs/django-outbox-pattern/bin/django-admin publish
