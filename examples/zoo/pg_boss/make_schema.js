// Prints the DDL pg-boss 10.4.2 installs itself: its construction plans (what boss.start() with
// migrate: true runs, PgBoss.getConstructionPlans, src/plans.js create()), plus the queue 'outbox'
// made by its own create_queue function with the options boss.createQueue('outbox', {...}) passes
// (src/manager.js:529-563). The queue's expireInSeconds is the jobs' lease, the argument.
// Run from this folder after `npm ci`:
//   node make_schema.js 5 > schema.sql           # inside its rules: the lease outlasts a batch
//   node make_schema.js 2 > schema_outside.sql   # the finding's: a 2.5 s pause outlasts it
const PgBoss = require('pg-boss');
const expireInSeconds = Number(process.argv[2]);
if (!(expireInSeconds >= 1)) throw new Error('usage: node make_schema.js EXPIRE_IN_SECONDS');
const queue = { policy: 'standard', retryLimit: 10, retryDelay: 1, expireInSeconds };
console.log('-- pg-boss 10.4.2: PgBoss.getConstructionPlans("pgboss") + create_queue(\'outbox\', ...) (make_schema.js)');
const plans = PgBoss.getConstructionPlans('pgboss');
console.log(plans + ';');
console.log(`SELECT pgboss.create_queue('outbox', '${JSON.stringify(queue)}'::json);`);
