"""outbox-lab hands relays `postgresql://user[:pw]@<percent-encoded socket dir>:PORT/db?application_name=relay-N`.
asyncpg and node-postgres read that as is; SQLAlchemy's asyncpg dialect does not (it resolves the
encoded socket dir as a host name, and passes query parameters as connect() kwargs, where asyncpg
has no application_name). sqlalchemy_asyncpg() rewrites it to
`postgresql+asyncpg://user[:pw]@/db?host=<dir>&port=PORT` and returns connect_args carrying
application_name as a server setting."""
from urllib.parse import urlsplit, urlunsplit, parse_qsl, urlencode, unquote

def sqlalchemy_asyncpg(url: str):
    p = urlsplit(url)
    q = dict(parse_qsl(p.query))
    app = q.pop("application_name", None)
    userinfo, _, hostport = p.netloc.rpartition("@")
    host, _, port = hostport.rpartition(":") if ":" in hostport and not hostport.endswith("]") else (hostport, "", "")
    host = unquote(host)
    if host.startswith("/"):
        q["host"] = host
        if port:
            q["port"] = port
        netloc = f"{userinfo}@" if userinfo else ""
    else:
        netloc = p.netloc
    connect_args = {"server_settings": {"application_name": app}} if app else {}
    return urlunsplit(("postgresql+asyncpg", netloc, p.path, urlencode(q), "")), connect_args

if __name__ == "__main__":   # for shell wrappers: print the rewritten URL
    import os
    print(sqlalchemy_asyncpg(os.environ["OUTBOX_LAB_DATABASE_URL"])[0])
