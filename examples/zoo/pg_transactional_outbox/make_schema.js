// Prints the DDL pg-transactional-outbox 0.5.7 generates itself (DatabaseSetup), without roles/grants.
const { DatabaseSetup } = require('pg-transactional-outbox');
const cfg = { outboxOrInbox: 'outbox', database: 'x', schema: 'public', table: 'outbox_pgto',
  listenerRole: 'x', nextMessagesName: 'next_outbox_messages' };
console.log('-- pg-transactional-outbox 0.5.7: DatabaseSetup.dropAndCreateTable + createPollingFunction + setupPollingIndexes');
console.log(DatabaseSetup.dropAndCreateTable(cfg));
console.log(DatabaseSetup.createPollingFunction(cfg));
console.log(DatabaseSetup.setupPollingIndexes(cfg));
