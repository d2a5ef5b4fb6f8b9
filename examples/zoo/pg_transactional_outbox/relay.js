// pg-transactional-outbox 0.5.7's own polling listener (next_outbox_messages(): oldest unprocessed
// message per segment, FOR NO KEY UPDATE NOWAIT, locked_until lease; then per message one
// transaction: SELECT ... FOR NO KEY UPDATE NOWAIT, the handler, processed_at = now, COMMIT).
// Ours: the handler (POST the row to outbox-lab's sink) and SIGTERM.
const { initializePollingMessageListener, getDefaultLogger } = require('pg-transactional-outbox');
const url = process.env.OUTBOX_LAB_SINK_URL || process.env.OUTBOX_LAB_HTTP_URL;
const db = { connectionString: process.env.OUTBOX_LAB_DATABASE_URL };
const logger = getDefaultLogger('zoo');
logger.level = process.env.ZOO_LOG_LEVEL || 'warn';
const [shutdown] = initializePollingMessageListener(
  { outboxOrInbox: 'outbox', dbListenerConfig: db, dbHandlerConfig: db,
    settings: { dbSchema: 'public', dbTable: 'outbox_pgto',
      nextMessagesFunctionSchema: 'public', nextMessagesFunctionName: 'next_outbox_messages',
      nextMessagesBatchSize: 5, nextMessagesLockInMs: Number(process.env.ZOO_LOCK_MS || 5000),
      nextMessagesPollingIntervalInMs: 100 } },
  { handle: async (m) => {
      const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ event_id: m.id, aggregate_id: m.aggregateId,
          aggregate_type: m.aggregateType, event_type: m.messageType, payload: m.payload }),
        signal: AbortSignal.timeout(2000) });
      if (!r.ok) throw new Error(`sink answered ${r.status}`);
    } },
  logger);
for (const s of ['SIGTERM', 'SIGINT']) process.on(s, async () => { await shutdown(); process.exit(0); });
