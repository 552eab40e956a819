-- The metadata schema and rows made by internal/state/meta at commit ea912ea
-- (testdata/mkfixture on schema meta_fixture), dumped by pg_dump 15 with
-- --inserts --no-owner --no-privileges; psql-only lines removed.
-- fixture_test.go loads it into a schema of its own.
--
-- PostgreSQL database dump
--


-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: meta_fixture; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA meta_fixture;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: api_keys; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.api_keys (
    hash text NOT NULL,
    tenant text NOT NULL,
    name text NOT NULL,
    prefix text NOT NULL,
    scopes text NOT NULL,
    created_ns bigint NOT NULL,
    expires_ns bigint DEFAULT 0 NOT NULL,
    revoked_ns bigint DEFAULT 0 NOT NULL
);


--
-- Name: checkpoints; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.checkpoints (
    id text NOT NULL,
    tenant text NOT NULL,
    sandbox_id text NOT NULL,
    state text NOT NULL,
    reason text NOT NULL,
    parent text NOT NULL,
    tag text NOT NULL,
    stream text NOT NULL,
    seq bigint NOT NULL,
    event_seq bigint NOT NULL,
    driver text NOT NULL,
    template text NOT NULL,
    template_version text NOT NULL,
    manifest_digest text NOT NULL,
    image_digest text NOT NULL,
    stats text NOT NULL,
    created_ns bigint NOT NULL,
    updated_ns bigint NOT NULL
);


--
-- Name: exposures; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.exposures (
    sandbox_id text NOT NULL,
    port bigint NOT NULL,
    tenant text NOT NULL,
    token_hash text NOT NULL,
    created_ns bigint NOT NULL
);


--
-- Name: failover_plan; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.failover_plan (
    sandbox_id text NOT NULL,
    dead_node text NOT NULL,
    target text NOT NULL,
    planned_ns bigint NOT NULL
);


--
-- Name: idempotency; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.idempotency (
    tenant text NOT NULL,
    key text NOT NULL,
    request_hash text NOT NULL,
    done bigint NOT NULL,
    status bigint NOT NULL,
    content_type text NOT NULL,
    body bytea NOT NULL,
    created_ns bigint NOT NULL
);


--
-- Name: meta_schema_version; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.meta_schema_version (
    version bigint NOT NULL
);


--
-- Name: node_cordons; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.node_cordons (
    id text NOT NULL,
    since_ns bigint NOT NULL
);


--
-- Name: nodes; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.nodes (
    id text NOT NULL,
    addr text NOT NULL,
    epoch bigint NOT NULL,
    state text NOT NULL,
    capacity text NOT NULL,
    started_ns bigint NOT NULL,
    heartbeat_ns bigint NOT NULL,
    expires_ns bigint NOT NULL,
    taken_by text DEFAULT ''::text NOT NULL
);


--
-- Name: sandbox_egress; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.sandbox_egress (
    sandbox text NOT NULL,
    policy text DEFAULT ''::text NOT NULL,
    run text DEFAULT ''::text NOT NULL,
    updated_ns bigint NOT NULL
);


--
-- Name: sandboxes; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.sandboxes (
    id text NOT NULL,
    tenant text NOT NULL,
    template text NOT NULL,
    template_version text NOT NULL,
    driver text NOT NULL,
    limits text NOT NULL,
    env text NOT NULL,
    state text NOT NULL,
    reason text NOT NULL,
    pooled bigint NOT NULL,
    from_pool bigint NOT NULL,
    created_ns bigint NOT NULL,
    updated_ns bigint NOT NULL,
    generation bigint DEFAULT 0 NOT NULL,
    origin text DEFAULT ''::text NOT NULL,
    policy text DEFAULT ''::text NOT NULL,
    node text DEFAULT ''::text NOT NULL
);


--
-- Name: secrets; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.secrets (
    tenant text NOT NULL,
    name text NOT NULL,
    sealed bytea NOT NULL,
    hosts text NOT NULL,
    updated_ns bigint NOT NULL
);


--
-- Name: sessions; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.sessions (
    id text NOT NULL,
    tenant text NOT NULL,
    definition text NOT NULL,
    status text NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    sandbox_id text DEFAULT ''::text NOT NULL,
    created_ns bigint NOT NULL,
    updated_ns bigint NOT NULL
);


--
-- Name: tenant_cas; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.tenant_cas (
    tenant text NOT NULL,
    cert_pem bytea NOT NULL,
    sealed_key bytea NOT NULL,
    created_ns bigint NOT NULL
);


--
-- Name: tenant_policies; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.tenant_policies (
    tenant text NOT NULL,
    policy text NOT NULL,
    updated_ns bigint NOT NULL
);


--
-- Name: tenant_quotas; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.tenant_quotas (
    tenant text NOT NULL,
    quota text NOT NULL,
    updated_ns bigint NOT NULL
);


--
-- Name: tenants; Type: TABLE; Schema: meta_fixture; Owner: -
--

CREATE TABLE meta_fixture.tenants (
    id text NOT NULL,
    name text NOT NULL,
    state text NOT NULL,
    created_ns bigint NOT NULL
);


--
-- Data for Name: api_keys; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.api_keys VALUES ('7c3d8e4e8707496cde47d4140bc9d6ba272aed9d890f50103d9018bef49d5407', 'default', 'admin', 'amber_operat', 'read,write,admin', 1700000000000000000, 0, 0);
INSERT INTO meta_fixture.api_keys VALUES ('af54cae7addfabc5734524f121b5f31e8fab5acde17801b334dc4b485d63d841', 'acme', 'ci', 'amber_acme_c', 'read,write', 1700000000000000000, 1731536000000000000, 0);


--
-- Data for Name: checkpoints; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.checkpoints VALUES ('ckpt-fixture', 'acme', 'sbx-fixture', 'committed', '', '', 'golden', 'sandbox/sbx-fixture', 3, 4, 'gvisor', 'minimal', 'v1', 'sha256:manifest', 'sha256:image', '{"frozen_ns":0,"dump_ns":0,"upload_ns":0,"total_ns":0,"memory_bytes":0,"layer_bytes":0,"image_bytes":0,"stored_bytes":4096,"chunks":0,"new_chunks":0}', 1700000001000000000, 1700000001000000000);


--
-- Data for Name: exposures; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.exposures VALUES ('sbx-fixture', 8000, 'acme', '8f3d4fb1e89fe7f9902cac17f36b7ab6533c5b971f20783c4e74bf9c67e9ca3e', 1700000001000000000);


--
-- Data for Name: failover_plan; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--



--
-- Data for Name: idempotency; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.idempotency VALUES ('acme', 'idem-1', 'req-hash', 1, 201, 'application/json', '\x7b226964223a227362782d66697874757265227d', 1700000001000000000);


--
-- Data for Name: meta_schema_version; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.meta_schema_version VALUES (5);


--
-- Data for Name: node_cordons; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--



--
-- Data for Name: nodes; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.nodes VALUES ('node-a', '127.0.0.1:7070', 1, 'live', '{"memory_bytes":0,"max_sandboxes":10,"sandboxes":0,"used_memory_bytes":0,"templates":null,"driver":"gvisor"}', 1700000001000000000, 1700000001000000000, 1700000061000000000, '');


--
-- Data for Name: sandbox_egress; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.sandbox_egress VALUES ('sbx-fixture', '{"allow":["example.com:443"],"burst":5}', 'run-1', 1700000001000000000);


--
-- Data for Name: sandboxes; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.sandboxes VALUES ('sbx-fixture', 'acme', 'minimal', 'v1', 'gvisor', '{"memory_bytes":268435456,"millicpus":500}', '["A=1"]', 'running', '', 0, 0, 1700000001000000000, 1700000001000000000, 0, '', 'fast', 'node-a');
INSERT INTO meta_fixture.sandboxes VALUES ('sbx-gone', 'acme', 'minimal', 'v1', 'criu', '{}', '[]', 'destroyed', 'rm', 0, 0, 1700000001000000000, 1700000001000000000, 0, '', '', '');


--
-- Data for Name: secrets; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.secrets VALUES ('acme', 'api-token', '\x010203', '["api.example.com:443"]', 1700000001000000000);


--
-- Data for Name: sessions; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.sessions VALUES ('ses-fixture', 'acme', '{"model":"m"}', 'idle', '', 'sbx-fixture', 1700000001000000000, 1700000001000000000);


--
-- Data for Name: tenant_cas; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.tenant_cas VALUES ('acme', '\x636572742d70656d', '\x7365616c65642d6b6579', 1700000001000000000);


--
-- Data for Name: tenant_policies; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.tenant_policies VALUES ('acme', '{"recovery":"fast","keep_checkpoints":3,"egress":{"allow":["pypi.org:443"]}}', 1700000000000000000);


--
-- Data for Name: tenant_quotas; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.tenant_quotas VALUES ('acme', '{"max_sandboxes":7,"budgets":{"cpu_seconds":1000}}', 1700000000000000000);


--
-- Data for Name: tenants; Type: TABLE DATA; Schema: meta_fixture; Owner: -
--

INSERT INTO meta_fixture.tenants VALUES ('default', 'default', 'active', 1700000000000000000);
INSERT INTO meta_fixture.tenants VALUES ('acme', 'Acme Corp', 'active', 1700000000000000000);


--
-- Name: api_keys api_keys_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.api_keys
    ADD CONSTRAINT api_keys_pkey PRIMARY KEY (hash);


--
-- Name: api_keys api_keys_tenant_name_key; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.api_keys
    ADD CONSTRAINT api_keys_tenant_name_key UNIQUE (tenant, name);


--
-- Name: checkpoints checkpoints_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.checkpoints
    ADD CONSTRAINT checkpoints_pkey PRIMARY KEY (id);


--
-- Name: exposures exposures_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.exposures
    ADD CONSTRAINT exposures_pkey PRIMARY KEY (sandbox_id, port);


--
-- Name: failover_plan failover_plan_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.failover_plan
    ADD CONSTRAINT failover_plan_pkey PRIMARY KEY (sandbox_id);


--
-- Name: idempotency idempotency_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.idempotency
    ADD CONSTRAINT idempotency_pkey PRIMARY KEY (tenant, key);


--
-- Name: node_cordons node_cordons_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.node_cordons
    ADD CONSTRAINT node_cordons_pkey PRIMARY KEY (id);


--
-- Name: nodes nodes_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.nodes
    ADD CONSTRAINT nodes_pkey PRIMARY KEY (id);


--
-- Name: sandbox_egress sandbox_egress_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.sandbox_egress
    ADD CONSTRAINT sandbox_egress_pkey PRIMARY KEY (sandbox);


--
-- Name: sandboxes sandboxes_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.sandboxes
    ADD CONSTRAINT sandboxes_pkey PRIMARY KEY (id);


--
-- Name: secrets secrets_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.secrets
    ADD CONSTRAINT secrets_pkey PRIMARY KEY (tenant, name);


--
-- Name: sessions sessions_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.sessions
    ADD CONSTRAINT sessions_pkey PRIMARY KEY (id);


--
-- Name: tenant_cas tenant_cas_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.tenant_cas
    ADD CONSTRAINT tenant_cas_pkey PRIMARY KEY (tenant);


--
-- Name: tenant_policies tenant_policies_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.tenant_policies
    ADD CONSTRAINT tenant_policies_pkey PRIMARY KEY (tenant);


--
-- Name: tenant_quotas tenant_quotas_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.tenant_quotas
    ADD CONSTRAINT tenant_quotas_pkey PRIMARY KEY (tenant);


--
-- Name: tenants tenants_pkey; Type: CONSTRAINT; Schema: meta_fixture; Owner: -
--

ALTER TABLE ONLY meta_fixture.tenants
    ADD CONSTRAINT tenants_pkey PRIMARY KEY (id);


--
-- Name: checkpoints_sandbox; Type: INDEX; Schema: meta_fixture; Owner: -
--

CREATE INDEX checkpoints_sandbox ON meta_fixture.checkpoints USING btree (sandbox_id, created_ns);


--
-- Name: checkpoints_state; Type: INDEX; Schema: meta_fixture; Owner: -
--

CREATE INDEX checkpoints_state ON meta_fixture.checkpoints USING btree (state);


--
-- Name: sandboxes_node; Type: INDEX; Schema: meta_fixture; Owner: -
--

CREATE INDEX sandboxes_node ON meta_fixture.sandboxes USING btree (node, state);


--
-- Name: sandboxes_tenant; Type: INDEX; Schema: meta_fixture; Owner: -
--

CREATE INDEX sandboxes_tenant ON meta_fixture.sandboxes USING btree (tenant, state);


--
-- Name: sessions_sandbox; Type: INDEX; Schema: meta_fixture; Owner: -
--

CREATE INDEX sessions_sandbox ON meta_fixture.sessions USING btree (sandbox_id);


--
-- Name: sessions_status; Type: INDEX; Schema: meta_fixture; Owner: -
--

CREATE INDEX sessions_status ON meta_fixture.sessions USING btree (status);


--
-- Name: sessions_tenant; Type: INDEX; Schema: meta_fixture; Owner: -
--

CREATE INDEX sessions_tenant ON meta_fixture.sessions USING btree (tenant, created_ns);


--
-- PostgreSQL database dump complete
--


