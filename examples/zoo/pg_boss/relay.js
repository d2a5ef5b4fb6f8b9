// outbox-lab's zoo entry for pg-boss 10.4.2 (a job queue used as an outbox): the library's own
// worker loop, unmodified. boss.work('outbox', ...) (src/manager.js:185-232, src/worker.js:41-87):
//   - fetch: one statement, SELECT ... WHERE state < 'active' AND start_after < now()
//     ORDER BY priority desc, created_on, id LIMIT batch FOR UPDATE SKIP LOCKED, then
//     UPDATE ... SET state = 'active', started_on = now() (src/plans.js:506-541), committed at once:
//     a lease, the job's expire_in;
//   - the handler gets the batch; when it resolves, complete(ids) (UPDATE ... WHERE state = 'active',
//     src/plans.js:543-557); when it throws or outlives expire_in, fail(ids) -> retry after
//     retry_delay, until retry_limit, then 'failed' (src/plans.js:559-620);
//   - its supervisor (maintenance every maintenanceIntervalSeconds) fails jobs active past their
//     expire_in (failJobsByTimeout, src/boss.js:163), so another worker fetches them again.
// Ours: the handler (POST each job's data, outbox-lab's event, the batch's POSTs side by side; a
// non-2xx answer or a POST past its limit throws once all are settled, which fails the batch),
// the settings below, and SIGTERM.
//
// The job's lease (expire_in), retry_limit and retry_delay are the queue's: schema.sql creates the
// queue 'outbox' with pg-boss's create_queue, and --insert-sql copies them from pgboss.queue as
// pg-boss's own insertJob does (src/plans.js:767-842).
// Command-line arguments (all optional):
//   --batch N             work()'s batchSize                         (default 10)
//   --poll-s S            work()'s pollingIntervalSeconds (min 0.5)  (default 0.5)
//   --maintenance-s S     maintenanceIntervalSeconds: how soon an expired job is retried (default 1)
//   --timeout-ms N        one POST's time limit                      (default 3000)
const PgBoss = require('pg-boss');

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  const v = Number(i >= 0 && i + 1 < args.length ? args[i + 1] : dflt);
  if (!Number.isFinite(v)) throw new Error(`${name}: not a number`);
  return v;
};
const batchSize = opt('--batch', 10);
const pollingIntervalSeconds = opt('--poll-s', 0.5);
const maintenanceIntervalSeconds = opt('--maintenance-s', 1);
const timeoutMs = opt('--timeout-ms', 3000);

const url = process.env.OUTBOX_LAB_SINK_URL || process.env.OUTBOX_LAB_HTTP_URL;
if (!url) throw new Error('OUTBOX_LAB_SINK_URL is not set');

// node-postgres takes outbox-lab's URL as it is; its application_name=relay-N wins over the
// 'pgboss' pg-boss puts in the pool's config (src/db.js:8), since pg lets the connection string's
// parameters override the config object's.
const boss = new PgBoss({
  connectionString: process.env.OUTBOX_LAB_DATABASE_URL,
  migrate: false, // schema.sql installed pg-boss's own construction plans
  supervise: true,
  maintenanceIntervalSeconds,
  schedule: false,
});
boss.on('error', (e) => console.error('[pg-boss]', e.message));

(async () => {
  await boss.start();
  // The batch's POSTs go out side by side and are all settled before the handler ends: one
  // batch is held at most one POST limit, inside the jobs' lease (expire_in), whatever the batch
  // size; a batch sent one POST after another is held up to batch x limit.
  await boss.work('outbox', { batchSize, pollingIntervalSeconds }, async (jobs) => {
    const sent = await Promise.allSettled(jobs.map(async (job) => {
      const r = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(job.data),
        signal: AbortSignal.timeout(timeoutMs),
      });
      await r.arrayBuffer();
      if (!r.ok) throw new Error(`sink answered ${r.status}`);
    }));
    const failed = sent.find((s) => s.status === 'rejected');
    if (failed) throw failed.reason;
  });
})().catch((e) => {
  console.error('[zoo-pg-boss] start:', e.message);
  process.exit(1);
});

let stopping = false;
for (const s of ['SIGTERM', 'SIGINT']) {
  process.on(s, async () => {
    if (stopping) return;
    stopping = true;
    const force = setTimeout(() => process.exit(0), 1500);
    try {
      await boss.stop({ graceful: true, timeout: 1000 });
    } finally {
      clearTimeout(force);
      process.exit(0);
    }
  });
}
