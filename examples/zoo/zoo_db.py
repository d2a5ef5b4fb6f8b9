"""outbox-lab hands relays `postgresql://user[:pw]@<percent-encoded socket dir>:PORT/db?application_name=relay-N`.
asyncpg and node-postgres read that as is; SQLAlchemy's asyncpg dialect does not (it resolves the
encoded socket dir as a host name, and passes query parameters as connect() kwargs, where asyncpg
has no application_name).

sqlalchemy_asyncpg_dsn() is for a library that builds its engine from a URL (or opens raw
asyncpg connections from its engine's URL, for LISTEN): it hands outbox-lab's URL, untouched, to asyncpg as its `dsn` argument
(`postgresql+asyncpg:///?dsn=<the URL, percent-encoded>`; SQLAlchemy's asyncpg dialect passes
the URL's query parameters to asyncpg.connect()), so every session keeps application_name
(relay-N) and asyncpg reads the socket directory itself."""
from urllib.parse import quote

def sqlalchemy_asyncpg_dsn(url: str) -> str:
    return "postgresql+asyncpg:///?dsn=" + quote(url, safe="")

if __name__ == "__main__":   # for shell wrappers: print the URL, in the dsn form
    import os
    print(sqlalchemy_asyncpg_dsn(os.environ["OUTBOX_LAB_DATABASE_URL"]))
