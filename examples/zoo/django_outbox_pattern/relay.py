#!/usr/bin/env python3
"""django-outbox-pattern 3.2.1's own relay, its `publish` management command
(management/commands/publish.py: a loop of Producer.publish_message_from_database,
producers.py:103-151), unmodified, with this folder's zoo_settings (outbox-lab's database) and
zoo_connection (the broker connection class: POST to outbox-lab's sink). Ours: the settings,
the connection class, and SIGTERM: it raises KeyboardInterrupt, which the command catches and
exits 0 on (publish.py:18-25); the open transaction, if any, rolls back."""
import os
import signal
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoo_settings")
signal.signal(signal.SIGTERM, signal.default_int_handler)

from django.core.management import execute_from_command_line  # noqa: E402

execute_from_command_line(["django-admin", "publish", *sys.argv[1:]])
