// Prints the DDL pg-boss 10.4.2 installs itself: its construction plans (what boss.start() with
// migrate: true runs, PgBoss.getConstructionPlans, src/plans.js create()), plus the queue 'outbox'
// made by its own create_queue function with the options boss.createQueue('outbox', {...}) passes
// (src/manager.js:529-563). The queue's expireInSeconds is the jobs' lease.
// Run from this folder after `npm ci`: node make_schema.js > schema.sql
const PgBoss = require('pg-boss');
const queue = { policy: 'standard', retryLimit: 10, retryDelay: 1, expireInSeconds: 2 };
console.log('-- pg-boss 10.4.2: PgBoss.getConstructionPlans("pgboss") + create_queue(\'outbox\', ...) (make_schema.js)');
const plans = PgBoss.getConstructionPlans('pgboss');
console.log(plans + ';');
console.log(`SELECT pgboss.create_queue('outbox', '${JSON.stringify(queue)}'::json);`);
