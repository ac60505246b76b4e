-- codemode state, PostgreSQL only, schema version 2: a gated call waits for one disk flush
-- (its audit line's) instead of three, and appends its audit line in one round trip.
-- Version 1's functions stay, so replicas of the previous release keep working meanwhile.

-- codemode_reserve as in version 1; with p_durable false its commit does not wait for the
-- write-ahead log to reach the disk. The hold is visible to every replica as soon as it
-- commits either way; what is at stake is only a server crash before the log is flushed
-- (at most a few hundred ms later, or sooner by any durable commit: the log is flushed in
-- order), which loses the hold of a call in flight. codemode_finish_hold below accepts such
-- a lost hold.
CREATE FUNCTION codemode_reserve(
    p_id text, p_keys text[], p_limits bigint[], p_amounts bigint[], p_now bigint, p_expires bigint,
    p_durable boolean
) RETURNS TABLE (refused_key text, refused_counter int, used bigint, reserved bigint, lim bigint)
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT p_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY SELECT * FROM codemode_reserve(p_id, p_keys, p_limits, p_amounts, p_now, p_expires);
END;
$$;

-- Version 1's, now probing for holds that ran out before updating them (the usual case is
-- none, and the update cost a fifth of a reservation). Same behaviour.
CREATE OR REPLACE FUNCTION codemode_lock_ledgers(p_keys text[], p_now bigint) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n int;
BEGIN
    PERFORM 1 FROM budget_ledgers WHERE key = ANY(p_keys) ORDER BY key COLLATE "C" FOR UPDATE;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n < cardinality(p_keys) THEN
        RAISE EXCEPTION 'a budget ledger row is missing' USING ERRCODE = 'CM001';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM budget_holds
                    WHERE ledger = ANY(p_keys) AND expired = 0 AND expires_at_ms <= p_now) THEN
        RETURN;
    END IF;
    WITH gone AS (
        UPDATE budget_holds SET expired = 1
         WHERE ledger = ANY(p_keys) AND expired = 0 AND expires_at_ms <= p_now
        RETURNING ledger, calls, model_calls, tokens, cost_micro_usd, bytes
    ), sums AS (
        SELECT ledger, sum(calls) AS calls, sum(model_calls) AS model_calls, sum(tokens) AS tokens,
               sum(cost_micro_usd) AS cost_micro_usd, sum(bytes) AS bytes
          FROM gone GROUP BY ledger
    )
    UPDATE budget_ledgers b
       SET reserved_calls = greatest(b.reserved_calls - s.calls, 0),
           reserved_model_calls = greatest(b.reserved_model_calls - s.model_calls, 0),
           reserved_tokens = greatest(b.reserved_tokens - s.tokens, 0),
           reserved_cost_micro_usd = greatest(b.reserved_cost_micro_usd - s.cost_micro_usd, 0),
           reserved_bytes = greatest(b.reserved_bytes - s.bytes, 0)
      FROM sums s
     WHERE b.key = s.ledger;
END;
$$;

-- codemode_finish_hold as in version 1 (each ledger now written once), with two more
-- parameters. p_age_ms: how long ago the caller made the reservation, by its own clock. A
-- hold that is not there although the server started less than p_age_ms (+1 s) ago was lost
-- in that restart (its reservation committed without waiting for the disk): settling charges
-- p_actual anyway and releasing does nothing. Otherwise a missing hold raises CM002 as before
-- (already settled or released). p_durable false: the commit does not wait for the disk, for
-- a caller whose next write is a durable commit (the call's audit line) that flushes this one
-- with it.
CREATE FUNCTION codemode_finish_hold(
    p_id text, p_keys text[], p_actual bigint[], p_now bigint, p_age_ms bigint, p_durable boolean
) RETURNS TABLE (key text, used bigint[], reserved bigint[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n int;
    live text[];
    h bigint[];
    a bigint[] := coalesce(p_actual, ARRAY[0, 0, 0, 0, 0]::bigint[]);
BEGIN
    IF NOT p_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM codemode_lock_ledgers(p_keys, p_now);
    -- A hold has the same amounts on each of its ledgers; `expired` says where they went back.
    WITH taken AS (
        DELETE FROM budget_holds t WHERE t.id = p_id
        RETURNING t.ledger, t.expired, t.calls, t.model_calls, t.tokens, t.cost_micro_usd, t.bytes
    )
    SELECT count(*), array_agg(t.ledger) FILTER (WHERE t.expired = 0),
           ARRAY[max(t.calls), max(t.model_calls), max(t.tokens), max(t.cost_micro_usd), max(t.bytes)]
      INTO n, live, h FROM taken t;
    IF n = 0 AND pg_postmaster_start_time()
            <= clock_timestamp() - make_interval(secs => (greatest(p_age_ms, 0) + 1000) / 1000.0) THEN
        RAISE EXCEPTION 'the budget reservation is not held' USING ERRCODE = 'CM002';
    END IF;
    RETURN QUERY
    WITH changed AS (
        UPDATE budget_ledgers b
           SET used_calls = b.used_calls + a[1],
               used_model_calls = b.used_model_calls + a[2],
               used_tokens = b.used_tokens + a[3],
               used_cost_micro_usd = b.used_cost_micro_usd + a[4],
               used_bytes = b.used_bytes + a[5],
               reserved_calls = CASE WHEN b.key = ANY(live)
                   THEN greatest(b.reserved_calls - h[1], 0) ELSE b.reserved_calls END,
               reserved_model_calls = CASE WHEN b.key = ANY(live)
                   THEN greatest(b.reserved_model_calls - h[2], 0) ELSE b.reserved_model_calls END,
               reserved_tokens = CASE WHEN b.key = ANY(live)
                   THEN greatest(b.reserved_tokens - h[3], 0) ELSE b.reserved_tokens END,
               reserved_cost_micro_usd = CASE WHEN b.key = ANY(live)
                   THEN greatest(b.reserved_cost_micro_usd - h[4], 0) ELSE b.reserved_cost_micro_usd END,
               reserved_bytes = CASE WHEN b.key = ANY(live)
                   THEN greatest(b.reserved_bytes - h[5], 0) ELSE b.reserved_bytes END
         WHERE b.key = ANY(p_keys)
        RETURNING b.key AS k,
               ARRAY[b.used_calls, b.used_model_calls, b.used_tokens, b.used_cost_micro_usd,
                     b.used_bytes] AS u,
               ARRAY[b.reserved_calls, b.reserved_model_calls, b.reserved_tokens,
                     b.reserved_cost_micro_usd, b.reserved_bytes] AS r
    )
    SELECT c.k, c.u, c.r FROM changed c;
END;
$$;

-- Appends p_lines (their hashes p_hashes, times p_at_ms) to p_stream if its head is still
-- (p_seq, p_hash): the head the caller chained the first line onto. Each line's seq and prev
-- follow from that head and the line before, so a batch cannot fork the chain. Returns whether
-- the lines were written and the head afterwards; when another writer moved the head, nothing
-- is written, and the caller chains its lines again onto the head returned. One statement and
-- one commit for any number of lines, with the head locked only while it runs.
CREATE FUNCTION codemode_append_audit(
    p_stream text, p_seq bigint, p_hash text, p_hashes text[], p_lines text[], p_at_ms bigint[]
) RETURNS TABLE (written boolean, head_seq bigint, head_hash text)
LANGUAGE plpgsql AS $$
DECLARE
    s bigint;
    h text;
    n int := cardinality(p_lines);
BEGIN
    IF n = 0 OR cardinality(p_hashes) <> n OR cardinality(p_at_ms) <> n THEN
        RAISE EXCEPTION 'an audit batch needs as many hashes and times as lines, and one line at least';
    END IF;
    SELECT a.seq, a.hash INTO s, h FROM audit_heads a WHERE a.stream = p_stream FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO audit_heads (stream, seq, hash) VALUES (p_stream, 0, '')
            ON CONFLICT (stream) DO NOTHING;
        SELECT a.seq, a.hash INTO s, h FROM audit_heads a WHERE a.stream = p_stream FOR UPDATE;
    END IF;
    IF s <> p_seq OR h <> p_hash THEN
        RETURN QUERY SELECT false, s, h;
        RETURN;
    END IF;
    INSERT INTO audit_lines (stream, seq, prev, hash, line, at_ms)
    SELECT p_stream, p_seq + t.i, CASE WHEN t.i = 1 THEN p_hash ELSE p_hashes[t.i - 1] END,
           t.hash, t.line, t.at_ms
      FROM unnest(p_hashes, p_lines, p_at_ms) WITH ORDINALITY AS t(hash, line, at_ms, i);
    UPDATE audit_heads SET seq = p_seq + n, hash = p_hashes[n] WHERE stream = p_stream;
    RETURN QUERY SELECT true, p_seq + n, p_hashes[n];
END;
$$;
