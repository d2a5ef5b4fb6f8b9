-- django-outbox-pattern 3.2.1: its migrations 0001-0006 as Django 5.2 compiles them for PostgreSQL (django-admin sqlmigrate django_outbox_pattern 000N, with zoo_settings; BEGIN/COMMIT left out)
--
-- Create model Published
--
CREATE TABLE "published" ("id" uuid NOT NULL PRIMARY KEY, "version" varchar(100) NOT NULL, "destination" varchar(255) NOT NULL, "body" jsonb NOT NULL, "added" timestamp with time zone NOT NULL, "expires_at" timestamp with time zone NOT NULL, "retry" integer NOT NULL CHECK ("retry" >= 0), "status" integer NOT NULL);
--
-- Create model Received
--
CREATE TABLE "received" ("id" uuid NOT NULL PRIMARY KEY, "headers" jsonb NULL, "body" jsonb NULL, "added" timestamp with time zone NOT NULL, "expires_at" timestamp with time zone NOT NULL, "retry" integer NOT NULL CHECK ("retry" >= 0), "status" integer NOT NULL);
--
-- Add field msg_id to received
--
ALTER TABLE "received" ADD COLUMN "msg_id" varchar(100) NULL;
--
-- Alter field version on published
--
ALTER TABLE "published" ALTER COLUMN "version" DROP NOT NULL;
--
-- Alter field added on published
--
CREATE INDEX "published_added_9200ad78" ON "published" ("added");
--
-- Alter field added on received
--
CREATE INDEX "received_added_0e9924c0" ON "received" ("added");
--
-- Alter field msg_id on received
--
ALTER TABLE "received" ADD CONSTRAINT "received_msg_id_b112b413_uniq" UNIQUE ("msg_id");
CREATE INDEX "received_msg_id_b112b413_like" ON "received" ("msg_id" varchar_pattern_ops);
--
-- Add field headers to published
--
ALTER TABLE "published" ADD COLUMN "headers" jsonb DEFAULT '{}'::jsonb NOT NULL;
ALTER TABLE "published" ALTER COLUMN "headers" DROP DEFAULT;
--
-- Create index published_status_27c9ec_btree on field(s) status of model published
--
CREATE INDEX "published_status_27c9ec_btree" ON "published" ("status");
