// pg-boss 10.4.2's own worker loop (boss.work: fetch with FOR UPDATE SKIP LOCKED -> state active,
// handler, complete; expired active jobs failed/retried by its supervisor). Ours: the handler.
const PgBoss = require('pg-boss');
const url = process.env.OUTBOX_LAB_SINK_URL || process.env.OUTBOX_LAB_HTTP_URL;
const boss = new PgBoss({ connectionString: process.env.OUTBOX_LAB_DATABASE_URL, migrate: false,
  supervise: true, maintenanceIntervalSeconds: 1, schedule: false });
boss.on('error', (e) => console.error('[pg-boss]', e.message));
(async () => {
  await boss.start();
  await boss.work('outbox', { pollingIntervalSeconds: 0.5, batchSize: 10 }, async (jobs) => {
    for (const job of jobs) {               // sequential, in fetch order
      const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify(job.data), signal: AbortSignal.timeout(2000) });
      if (!r.ok) throw new Error(`sink answered ${r.status}`);
    }
  });
})();
for (const s of ['SIGTERM', 'SIGINT']) process.on(s, async () => { await boss.stop({ graceful: true, timeout: 1000 }); process.exit(0); });
