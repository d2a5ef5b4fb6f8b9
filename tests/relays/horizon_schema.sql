-- horizon.py's mark: how far each relay got, saved in the transaction of each batch.
CREATE TABLE horizon_mark (
  relay    text   PRIMARY KEY,
  last_xid bigint NOT NULL,
  last_id  bigint NOT NULL
);
