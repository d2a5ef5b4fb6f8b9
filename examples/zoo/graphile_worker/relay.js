// outbox-lab's zoo entry for graphile-worker 0.17.3 (a PostgreSQL job queue used as an outbox):
// the library's own worker pool, run() (dist/main.js, dist/worker.js), unmodified:
//   - each worker fetches one job: one statement, SELECT ... FROM _private_jobs WHERE is_available
//     AND run_at <= now() AND (job_queue_id IS NULL OR job_queue_id IN (SELECT ... FROM
//     _private_job_queues WHERE is_available FOR UPDATE SKIP LOCKED)) ORDER BY priority, run_at
//     LIMIT 1 FOR UPDATE SKIP LOCKED, then sets locked_by/locked_at on the job and on its named
//     queue (dist/sql/getJobs.js), committed at once: the job and its whole queue are the
//     worker's until it completes or fails the job (or for 4 hours, dist/sql/resetLockedAt.js);
//   - the task runs; success: DELETE the job and unlock its queue (dist/sql/completeJobs.js);
//     a throw: attempts stay counted, run_at moves by exp(min(attempts, 10)) seconds, job and
//     queue unlocked (dist/sql/failJobs.js), until max_attempts (25 by default);
//   - LISTEN jobs:insert (add_job notifies) wakes an idle worker; else it polls every pollInterval.
// The supervisor's documented recovery (admin-functions.md:95-100 at v0.17.3: "the process that
// runs Graphile Worker notices that it has exited) then you can use the 'force unlock workers'
// functionality"): this wrapper is what verify's supervisor starts again after a crash, so it
// records its pool's id (the jobs' and queues' locked_by) under its relay name, and when it
// starts again it unlocks the ids of its previous incarnations with the library's own
// workerUtils.forceUnlockWorkers before its pool starts. Without it a dead worker's jobs wait
// the 4 hours the docs give. The record is a table of its own, zoo_supervisor_pools, in public
// (made by the entry's schema.sql, once, before the relays start).
// (A kill in the moment between the pool's creation and its record's commit would leave that
// pool's jobs to the 4-hour sweep.)
// Ours: the task 'outbox' (POST the job's payload, outbox-lab's event; a non-2xx answer throws),
// the settings below, and SIGTERM (graphile-worker's own handler would end the process by
// re-raising the signal, exit 143; ours calls runner.stop(), its graceful shutdown, and exits 0).
// Command-line arguments (all optional):
//   --concurrency N   jobs run at once per process (graphile-worker's concurrentJobs, default 1)
//   --poll-ms N       pollInterval (graphile-worker's default 2000)
//   --timeout-ms N    one POST's time limit (default 5000)
//   --no-force-unlock a deployment without the supervisor's documented recovery: a crashed
//                     worker's jobs wait for the 4-hour sweep
const { EventEmitter } = require('node:events');
const { run, makeWorkerUtils } = require('graphile-worker');

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  const v = Number(i >= 0 && i + 1 < args.length ? args[i + 1] : dflt);
  if (!Number.isFinite(v)) throw new Error(`${name}: not a number`);
  return v;
};
const concurrency = opt('--concurrency', 1);
const pollInterval = opt('--poll-ms', 2000);
const timeoutMs = opt('--timeout-ms', 5000);
const forceUnlock = !args.includes('--no-force-unlock');

const url = process.env.OUTBOX_LAB_SINK_URL || process.env.OUTBOX_LAB_HTTP_URL;
if (!url) throw new Error('OUTBOX_LAB_SINK_URL is not set');

let runner = null;
let stopping = false;

const relayName = process.env.OUTBOX_LAB_RELAY_NAME || 'relay';

// Unlocks what this relay's previous incarnations held, and returns how to record the new pool.
async function recoverPreviousIncarnations(connectionString) {
  const utils = await makeWorkerUtils({ connectionString });
  // (zoo_supervisor_pools is the schema's: make_schema.sh.)
  const { rows } = await utils.withPgClient((client) =>
    client.query('SELECT pool_id FROM zoo_supervisor_pools WHERE relay = $1', [relayName]),
  );
  const dead = rows.map((r) => r.pool_id);
  if (dead.length > 0) {
    await utils.forceUnlockWorkers(dead);
    await utils.withPgClient((client) =>
      client.query('DELETE FROM zoo_supervisor_pools WHERE relay = $1 AND pool_id = ANY($2)', [
        relayName,
        dead,
      ]),
    );
    console.error(`[zoo-graphile-worker] ${relayName}: force_unlock_workers(${dead.join(', ')})`);
  }
  return async (poolId) => {
    await utils.withPgClient((client) =>
      client.query('INSERT INTO zoo_supervisor_pools (relay, pool_id) VALUES ($1, $2)', [
        relayName,
        poolId,
      ]),
    );
  };
}

(async () => {
  const connectionString = process.env.OUTBOX_LAB_DATABASE_URL;
  const events = new EventEmitter();
  const record = forceUnlock ? await recoverPreviousIncarnations(connectionString) : null;
  events.on('pool:create', ({ workerPool }) => {
    if (!record) return;
    record(workerPool.id).catch((e) => {
      console.error('[zoo-graphile-worker] recording the pool:', e.message);
      process.exit(1);
    });
  });
  // node-postgres takes outbox-lab's URL as it is (socket directory, application_name=relay-N).
  runner = await run({
    connectionString,
    events,
    concurrency,
    pollInterval,
    noHandleSignals: true,
    parsedCronItems: [], // no cron: nor a crontab file read from the working directory
    taskList: {
      outbox: async (payload) => {
        const r = await fetch(url, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify(payload),
          signal: AbortSignal.timeout(timeoutMs),
        });
        await r.arrayBuffer();
        if (!r.ok) throw new Error(`sink answered ${r.status}`);
      },
    },
  });
  if (stopping) await runner.stop();
  await runner.promise;
})().catch((e) => {
  console.error('[zoo-graphile-worker]', e.message);
  process.exit(1);
});

for (const s of ['SIGTERM', 'SIGINT']) {
  process.on(s, async () => {
    if (stopping) return;
    stopping = true;
    const force = setTimeout(() => process.exit(0), 2000);
    try {
      if (runner) await runner.stop();
    } catch (e) {
      console.error('[zoo-graphile-worker] stop:', e.message);
    } finally {
      clearTimeout(force);
      process.exit(0);
    }
  });
}
