//! What must never be shown: the password or token in a URL's user part
//! (`scheme://user:PASSWORD@`, `nats://TOKEN@`) and libpq's `password=` keyword. [`redact`] masks
//! them in any text outbox-lab prints or writes (errors, log lines, results files, the report);
//! [`without_secrets`] leaves them out of a value put on a child's command line, which every
//! local user can read (the child gets the whole value in its environment).

/// What a secret is replaced with in text that is shown.
const MASK: &str = "***";

/// Schemes whose user part alone is a secret: a NATS token (`nats://TOKEN@host`).
const TOKEN_SCHEMES: [&str; 4] = ["nats", "tls", "ws", "wss"];

/// Schemes whose whole user part stays off a command line: a NATS token, and the brokers'
/// users, random names that go with their passwords (the throwaway Redis, RabbitMQ and Kafka).
const BROKER_SCHEMES: [&str; 11] = [
    "nats",
    "tls",
    "ws",
    "wss",
    "amqp",
    "amqps",
    "redis",
    "rediss",
    "redis+unix",
    "unix",
    "kafka",
];

/// `text` with every secret masked: `user:PASSWORD@` -> `user:***@`, `:PASSWORD@` -> `:***@`,
/// `nats://TOKEN@` -> `nats://***@`, `password=VALUE` or `password='quoted value'` ->
/// `password=***`. A user name alone is kept (it is no secret), and so is everything else.
pub fn redact(text: &str) -> String {
    let mut cuts: Vec<(usize, usize, String)> = userinfos(text)
        .into_iter()
        .filter_map(|u| match text[u.start..u.at].find(':') {
            Some(colon) => Some((u.start + colon + 1, u.at, MASK.to_string())),
            None if u.start < u.at && is_one_of(u.scheme, &TOKEN_SCHEMES) => {
                Some((u.start, u.at, MASK.to_string()))
            }
            None => None,
        })
        .collect();
    cuts.extend(
        password_keywords(text)
            .into_iter()
            .map(|k| (k.value, k.end, MASK.to_string())),
    );
    splice(text, cuts)
}

/// `connection` (a URL, a comma-separated list of NATS URLs, or libpq keywords) as it may
/// stand on a command line: a PostgreSQL (or HTTP) URL without its password, its user kept;
/// a NATS, AMQP, Redis or Kafka URL without its whole user part, as the broker's user goes with its
/// password; libpq keywords without `password=...`.
pub fn without_secrets(connection: &str) -> String {
    let mut cuts: Vec<(usize, usize, String)> = userinfos(connection)
        .into_iter()
        .map(|u| {
            let after_at = u.at + 1;
            match connection[u.start..u.at].find(':') {
                _ if is_one_of(u.scheme, &BROKER_SCHEMES) => (u.start, after_at, String::new()),
                Some(0) => (u.start, after_at, String::new()),
                Some(colon) => (u.start + colon, u.at, String::new()),
                None => (u.at, u.at, String::new()),
            }
        })
        .collect();
    cuts.extend(
        password_keywords(connection)
            .into_iter()
            .map(|k| (k.keyword_start, k.end, String::new())),
    );
    splice(connection, cuts)
}

/// The user part of one `scheme://user@` in a text: `text[start..at]`, `at` the `@`.
struct Userinfo<'a> {
    scheme: &'a str,
    start: usize,
    at: usize,
}

/// Every `scheme://...@` in `text`, also in malformed URLs (a port that is no number, a
/// password with an unencoded `/`) and in comma-separated lists.
fn userinfos(text: &str) -> Vec<Userinfo<'_>> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(offset) = text[from..].find("://") {
        let separator = from + offset;
        let start = separator + 3;
        from = start;
        let scheme = &text[scheme_start(text, separator)..separator];
        if scheme.is_empty() {
            continue;
        }
        // The URL ends where the word does, or where the next URL of a list begins.
        let word_end = text[start..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>'))
            .map_or(text.len(), |i| start + i);
        let end = text[start..word_end]
            .find("://")
            .map_or(word_end, |i| scheme_start(text, start + i));
        let url = &text[start..end];
        // The user part ends at the last `@` of the authority; failing that (a password with
        // an unencoded `/`, `?` or `#`), at the last `@` after a `:` anywhere: better a path
        // masked than a password shown.
        let authority = url.find(['/', '?', '#']).map_or(url, |i| &url[..i]);
        let at = authority.rfind('@').or_else(|| {
            let at = url.rfind('@')?;
            url[..at].contains(':').then_some(at)
        });
        if let Some(at) = at {
            found.push(Userinfo {
                scheme,
                start,
                at: start + at,
            });
            from = start + at + 1;
        }
    }
    found
}

/// Where the scheme before `text[separator..]` (`://`) begins.
fn scheme_start(text: &str, separator: usize) -> usize {
    text[..separator]
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        .last()
        .map_or(separator, |(i, _)| i)
}

fn is_one_of(scheme: &str, schemes: &[&str]) -> bool {
    schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme))
}

/// One `password=VALUE` of libpq's keyword form: `text[keyword_start..end]` is the pair (with
/// the blanks before it), `text[value..end]` the value.
struct PasswordKeyword {
    keyword_start: usize,
    value: usize,
    end: usize,
}

/// Every `password = VALUE` in `text` that starts a word, VALUE plain (up to a blank or a `"`,
/// where a JSON string would end) or single-quoted with backslash escapes.
fn password_keywords(text: &str) -> Vec<PasswordKeyword> {
    const KEYWORD: &str = "password";
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(offset) = text[from..].find(KEYWORD) {
        let at = from + offset;
        from = at + KEYWORD.len();
        let starts_word = text[..at]
            .chars()
            .next_back()
            .is_none_or(char::is_whitespace);
        let rest = text[from..].trim_start_matches([' ', '\t']);
        let Some(value) = rest.strip_prefix('=') else {
            continue;
        };
        if !starts_word {
            continue;
        }
        let value = value.trim_start_matches([' ', '\t']);
        let value_start = text.len() - value.len();
        let value_len = match value.strip_prefix('\'') {
            Some(quoted) => {
                let mut escaped = false;
                let close = quoted.char_indices().find(|&(_, c)| {
                    let closes = c == '\'' && !escaped;
                    escaped = c == '\\' && !escaped;
                    closes
                });
                close.map_or(value.len(), |(i, _)| 1 + i + 1)
            }
            None => value
                .find(|c: char| c.is_whitespace() || c == '"')
                .unwrap_or(value.len()),
        };
        let keyword_start = text[..at].trim_end_matches([' ', '\t']).len();
        found.push(PasswordKeyword {
            keyword_start,
            value: value_start,
            end: value_start + value_len,
        });
        from = value_start + value_len;
    }
    found
}

/// `text` with each range `start..end` replaced by its text (ranges that overlap an earlier
/// one are left out).
fn splice(text: &str, mut cuts: Vec<(usize, usize, String)>) -> String {
    cuts.sort_by_key(|&(start, end, _)| (start, end));
    let mut out = String::with_capacity(text.len());
    let mut done = 0;
    for (start, end, replacement) in cuts {
        if start < done {
            continue;
        }
        out.push_str(&text[done..start]);
        out.push_str(&replacement);
        done = end;
    }
    out.push_str(&text[done..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_masked_and_users_kept() {
        for (text, shown) in [
            ("postgres://u:pw@h:5432/db", "postgres://u:***@h:5432/db"),
            ("redis://:pw@127.0.0.1:1", "redis://:***@127.0.0.1:1"),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("http://h:8080/events", "http://h:8080/events"),
            // The first `:` ends the user: a password may hold one.
            ("amqp://u:p:w@h:5672/%2f", "amqp://u:***@h:5672/%2f"),
            // A password with an `@` in it (not encoded): the last one ends it.
            ("http://u:p@w@h:1/", "http://u:***@h:1/"),
        ] {
            assert_eq!(redact(text), shown, "{text}");
        }
    }

    #[test]
    fn urls_in_any_text_are_masked_also_several_and_malformed() {
        assert_eq!(
            redact("invalid --database-url 'postgres://u:pw@127.0.0.1:notaport/db': bad port"),
            "invalid --database-url 'postgres://u:***@127.0.0.1:notaport/db': bad port"
        );
        assert_eq!(
            redact("POST http://u:pw@127.0.0.1:1/events: refused; then redis://:x@h:1 too"),
            "POST http://u:***@127.0.0.1:1/events: refused; then redis://:***@h:1 too"
        );
        // A password with an unencoded `/` in it.
        assert_eq!(
            redact("at postgres://u:pa/ss@h/db."),
            "at postgres://u:***@h/db."
        );
        // In JSON, the string ends the URL.
        assert_eq!(
            redact(r#"{"cmd":"relay --database-url postgresql://u:pw@h:1/d","n":1}"#),
            r#"{"cmd":"relay --database-url postgresql://u:***@h:1/d","n":1}"#
        );
        assert_eq!(redact("no url here: a@b, x://"), "no url here: a@b, x://");
    }

    #[test]
    fn nats_tokens_are_masked_also_in_lists() {
        assert_eq!(
            redact("nats://s3cret@127.0.0.1:4222"),
            "nats://***@127.0.0.1:4222"
        );
        assert_eq!(
            redact("at nats://t@127.0.0.1:1,nats://u:p@127.0.0.1:2,nats://127.0.0.1:3 ok"),
            "at nats://***@127.0.0.1:1,nats://u:***@127.0.0.1:2,nats://127.0.0.1:3 ok"
        );
    }

    #[test]
    fn libpq_passwords_are_masked() {
        assert_eq!(
            redact("host=h user='u' password=s3cret dbname=d"),
            "host=h user='u' password=*** dbname=d"
        );
        assert_eq!(
            redact(r"host=h password = 'a b\'c' dbname=d"),
            "host=h password = *** dbname=d"
        );
        assert_eq!(
            redact(r#"{"dsn":"host=h password=x"}"#),
            r#"{"dsn":"host=h password=***"}"#
        );
        // Only the keyword, as a word of its own.
        assert_eq!(redact("PGPASSWORD is set"), "PGPASSWORD is set");
        assert_eq!(redact("the password is wrong"), "the password is wrong");
    }

    #[test]
    fn redacting_twice_changes_nothing_more() {
        let once = redact("postgres://u:pw@h/db nats://t@h:1 password='x y'");
        assert_eq!(redact(&once), once);
    }

    #[test]
    fn command_line_values_leave_passwords_out() {
        for (value, shown) in [
            (
                "postgresql://u:p%40ss@%2Ftmp%2Fs:5432/db",
                "postgresql://u@%2Ftmp%2Fs:5432/db",
            ),
            ("postgresql://u@h:5432/db", "postgresql://u@h:5432/db"),
            ("postgres://:pw@h/db", "postgres://h/db"),
            ("http://u:pw@127.0.0.1:1/", "http://u@127.0.0.1:1/"),
            ("http://127.0.0.1:1/", "http://127.0.0.1:1/"),
            ("nats://s3cret@127.0.0.1:4222", "nats://127.0.0.1:4222"),
            ("nats://user:pa@ss@host:4222", "nats://host:4222"),
            (
                "nats://t@127.0.0.1:1,nats://t@127.0.0.1:2",
                "nats://127.0.0.1:1,nats://127.0.0.1:2",
            ),
            (
                "amqp://u:pw@127.0.0.1:5672/%2f",
                "amqp://127.0.0.1:5672/%2f",
            ),
            ("redis://:pw@127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("", ""),
            (
                "host='/tmp/s' port=5432 user='u' dbname='d' password='p \\'w'",
                "host='/tmp/s' port=5432 user='u' dbname='d'",
            ),
            ("host=h password=pw dbname=d", "host=h dbname=d"),
        ] {
            assert_eq!(without_secrets(value), shown, "{value}");
        }
    }
}
