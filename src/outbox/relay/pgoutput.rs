//! The two pgoutput messages the CDC relay needs, decoded from the bytes of the replication
//! stream (protocol version 1, text format): Relation (which table an OID is, and its column
//! names) and Insert (the new row). pgwire-replication decodes the transaction boundaries and
//! hands every other message over raw; the format is PostgreSQL's "Logical Replication Message
//! Formats" chapter.

use std::collections::HashMap;

use anyhow::{anyhow, bail, Context, Result};

/// A table as a Relation message describes it.
#[derive(Debug, Clone)]
pub struct Relation {
    pub name: String,
    pub columns: Vec<String>,
}

/// A decoded message of interest.
#[derive(Debug)]
pub enum Change {
    Relation {
        oid: u32,
        relation: Relation,
    },
    /// The inserted row: its columns' text values (`None` for NULL), in the relation's order.
    Insert {
        oid: u32,
        values: Vec<Option<String>>,
    },
    /// Any other message (Delete, Update, Type, Origin, Truncate): the relay ignores them.
    Other,
}

/// Decodes one pgoutput message.
pub fn decode(message: &[u8]) -> Result<Change> {
    let mut reader = Reader { rest: message };
    match reader.byte()? {
        b'R' => {
            let oid = reader.u32()?;
            let _namespace = reader.cstring()?;
            let name = reader.cstring()?;
            let _replica_identity = reader.byte()?;
            let count = reader.u16()?;
            let mut columns = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let _flags = reader.byte()?;
                columns.push(reader.cstring()?);
                let _type_oid = reader.u32()?;
                let _type_modifier = reader.u32()?;
            }
            Ok(Change::Relation {
                oid,
                relation: Relation { name, columns },
            })
        }
        b'I' => {
            let oid = reader.u32()?;
            if reader.byte()? != b'N' {
                bail!("pgoutput Insert without a new tuple");
            }
            Ok(Change::Insert {
                oid,
                values: reader.tuple()?,
            })
        }
        _ => Ok(Change::Other),
    }
}

/// An inserted row by column name.
pub fn row_by_name<'a>(
    relation: &'a Relation,
    values: &'a [Option<String>],
) -> HashMap<&'a str, Option<&'a str>> {
    relation
        .columns
        .iter()
        .map(String::as_str)
        .zip(values.iter().map(Option::as_deref))
        .collect()
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.rest.len() < n {
            bail!("pgoutput message ends early");
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into()?))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into()?))
    }

    fn cstring(&mut self) -> Result<String> {
        let end = self
            .rest
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| anyhow!("pgoutput string without its terminating zero"))?;
        let text = String::from_utf8(self.take(end)?.to_vec()).context("pgoutput string")?;
        self.take(1)?;
        Ok(text)
    }

    /// TupleData: a count, then per column 'n' (NULL), 'u' (unchanged TOAST) or 't' + text.
    fn tuple(&mut self) -> Result<Vec<Option<String>>> {
        let count = self.u16()?;
        let mut values = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            values.push(match self.byte()? {
                b'n' | b'u' => None,
                b't' => {
                    let len = self.u32()? as usize;
                    Some(String::from_utf8(self.take(len)?.to_vec()).context("pgoutput value")?)
                }
                kind => bail!("pgoutput column kind '{}' (binary format?)", kind as char),
            });
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cstring(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }

    /// A Relation and an Insert as PostgreSQL writes them decode to the row by column name.
    #[test]
    fn relation_and_insert_decode() {
        let mut relation = vec![b'R'];
        relation.extend_from_slice(&16384u32.to_be_bytes());
        cstring(&mut relation, "public");
        cstring(&mut relation, "outbox");
        relation.push(b'd');
        relation.extend_from_slice(&2u16.to_be_bytes());
        for name in ["id", "published_at"] {
            relation.push(1);
            cstring(&mut relation, name);
            relation.extend_from_slice(&20u32.to_be_bytes());
            relation.extend_from_slice(&u32::MAX.to_be_bytes());
        }
        let Change::Relation { oid, relation } = decode(&relation).unwrap() else {
            panic!("not a relation")
        };
        assert_eq!((oid, relation.name.as_str()), (16384, "outbox"));

        let mut insert = vec![b'I'];
        insert.extend_from_slice(&16384u32.to_be_bytes());
        insert.push(b'N');
        insert.extend_from_slice(&2u16.to_be_bytes());
        insert.push(b't');
        insert.extend_from_slice(&2u32.to_be_bytes());
        insert.extend_from_slice(b"42");
        insert.push(b'n');
        let Change::Insert { values, .. } = decode(&insert).unwrap() else {
            panic!("not an insert")
        };
        let row = row_by_name(&relation, &values);
        assert_eq!(row["id"], Some("42"));
        assert_eq!(row["published_at"], None);
        assert!(decode(&insert[..8]).is_err());
    }
}
