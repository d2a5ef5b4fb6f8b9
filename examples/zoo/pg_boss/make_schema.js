// pg-boss 10.4.2's own construction plans (what boss.start() would install), plus the queue "outbox".
const PgBoss = require('pg-boss');
console.log('-- pg-boss 10.4.2: PgBoss.getConstructionPlans("pgboss") + create_queue(\'outbox\', ...)');
console.log(PgBoss.getConstructionPlans('pgboss') + ';');
console.log(`SELECT pgboss.create_queue('outbox', '{"policy":"standard","retryLimit":10,"retryDelay":1,"expireInSeconds":5}'::json);`);
