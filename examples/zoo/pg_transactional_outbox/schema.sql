-- pg-transactional-outbox 0.5.7: DatabaseSetup.dropAndCreateTable + createPollingFunction + setupPollingIndexes

CREATE SCHEMA IF NOT EXISTS public;

DROP TABLE IF EXISTS public.outbox_pgto CASCADE;
CREATE TABLE public.outbox_pgto (
  id uuid PRIMARY KEY,
  aggregate_type TEXT NOT NULL,
  aggregate_id TEXT NOT NULL,
  message_type TEXT NOT NULL,
  segment TEXT,
  concurrency TEXT NOT NULL DEFAULT 'sequential',
  payload JSONB NOT NULL,
  metadata JSONB,
  locked_until TIMESTAMPTZ NOT NULL DEFAULT to_timestamp(0),
  created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  processed_at TIMESTAMPTZ,
  abandoned_at TIMESTAMPTZ,
  started_attempts smallint NOT NULL DEFAULT 0,
  finished_attempts smallint NOT NULL DEFAULT 0
);
ALTER TABLE public.outbox_pgto ADD CONSTRAINT outbox_concurrency_check
  CHECK (concurrency IN ('sequential', 'parallel'));

DROP FUNCTION IF EXISTS public.next_outbox_messages(integer, integer);
CREATE OR REPLACE FUNCTION public.next_outbox_messages(
  max_size integer, lock_ms integer)
    RETURNS SETOF public.outbox_pgto
    LANGUAGE 'plpgsql'

AS $BODY$
DECLARE
  loop_row public.outbox_pgto%ROWTYPE;
  message_row public.outbox_pgto%ROWTYPE;
  ids uuid[] := '{}';
BEGIN

  IF max_size < 1 THEN
    RAISE EXCEPTION 'The max_size for the next messages batch must be at least one.' using errcode = 'MAXNR';
  END IF;

  -- get (only) the oldest message of every segment but only return it if it is not locked
  FOR loop_row IN
    SELECT * FROM public.outbox_pgto m WHERE m.id in (SELECT DISTINCT ON (segment) id
      FROM public.outbox_pgto
      WHERE processed_at IS NULL AND abandoned_at IS NULL
      ORDER BY segment, created_at) order by created_at
  LOOP
    BEGIN
      EXIT WHEN cardinality(ids) >= max_size;

      SELECT *
        INTO message_row
        FROM public.outbox_pgto
        WHERE id = loop_row.id
        FOR NO KEY UPDATE NOWAIT; -- throw/catch error when locked

      IF message_row.locked_until > NOW() THEN
        CONTINUE;
      END IF;

      ids := array_append(ids, message_row.id);
    EXCEPTION
      WHEN lock_not_available THEN
        CONTINUE;
      WHEN serialization_failure THEN
        CONTINUE;
    END;
  END LOOP;

  -- if max_size not reached: get the oldest parallelizable message independent of segment
  IF cardinality(ids) < max_size THEN
    FOR loop_row IN
      SELECT * FROM public.outbox_pgto
        WHERE concurrency = 'parallel' AND processed_at IS NULL AND abandoned_at IS NULL AND locked_until < NOW()
          AND id NOT IN (SELECT UNNEST(ids))
        order by created_at
    LOOP
      BEGIN
        EXIT WHEN cardinality(ids) >= max_size;

        SELECT *
          INTO message_row
          FROM public.outbox_pgto
          WHERE id = loop_row.id
          FOR NO KEY UPDATE NOWAIT; -- throw/catch error when locked

        ids := array_append(ids, message_row.id);
      EXCEPTION
        WHEN lock_not_available THEN
          CONTINUE;
        WHEN serialization_failure THEN
          CONTINUE;
      END;
    END LOOP;
  END IF;

  -- set a short lock value so the the workers can each process a message
  IF cardinality(ids) > 0 THEN

    RETURN QUERY
      UPDATE public.outbox_pgto
        SET locked_until = clock_timestamp() + (lock_ms || ' milliseconds')::INTERVAL, started_attempts = started_attempts + 1
        WHERE ID = ANY(ids)
        RETURNING *;

  END IF;
END;
$BODY$;


DROP INDEX IF EXISTS outbox_segment_idx;
CREATE INDEX outbox_segment_idx ON public.outbox_pgto (segment);
DROP INDEX IF EXISTS outbox_created_at_idx;
CREATE INDEX outbox_created_at_idx ON public.outbox_pgto (created_at);
DROP INDEX IF EXISTS outbox_processed_at_idx;
CREATE INDEX outbox_processed_at_idx ON public.outbox_pgto (processed_at);
DROP INDEX IF EXISTS outbox_abandoned_at_idx;
CREATE INDEX outbox_abandoned_at_idx ON public.outbox_pgto (abandoned_at);
DROP INDEX IF EXISTS outbox_locked_until_idx;
CREATE INDEX outbox_locked_until_idx ON public.outbox_pgto (locked_until);

