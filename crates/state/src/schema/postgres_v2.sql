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

-- codemode_finish_hold as in version 1, with two more parameters. p_age_ms: how long ago the
-- caller made the reservation, by its own clock. A hold that is not there although the server
-- started less than p_age_ms (+1 s) ago was lost in that restart (its reservation committed
-- without waiting for the disk): settling charges p_actual anyway and releasing does nothing.
-- Otherwise a missing hold raises CM002 as before (already settled or released). p_durable
-- false: the commit does not wait for the disk, for a caller whose next write is a durable
-- commit (the call's audit line) that flushes this one with it.
CREATE FUNCTION codemode_finish_hold(
    p_id text, p_keys text[], p_actual bigint[], p_now bigint, p_age_ms bigint, p_durable boolean
) RETURNS TABLE (key text, used bigint[], reserved bigint[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n int;
BEGIN
    IF NOT p_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM codemode_lock_ledgers(p_keys, p_now);
    WITH taken AS (
        DELETE FROM budget_holds h WHERE h.id = p_id
        RETURNING h.ledger, h.expired, h.calls, h.model_calls, h.tokens, h.cost_micro_usd, h.bytes
    ), held AS (
        SELECT * FROM taken WHERE expired = 0
    ), back AS (
        UPDATE budget_ledgers b
           SET reserved_calls = greatest(b.reserved_calls - h.calls, 0),
               reserved_model_calls = greatest(b.reserved_model_calls - h.model_calls, 0),
               reserved_tokens = greatest(b.reserved_tokens - h.tokens, 0),
               reserved_cost_micro_usd = greatest(b.reserved_cost_micro_usd - h.cost_micro_usd, 0),
               reserved_bytes = greatest(b.reserved_bytes - h.bytes, 0)
          FROM held h
         WHERE b.key = h.ledger
    )
    SELECT count(*) INTO n FROM taken;
    IF n = 0 AND pg_postmaster_start_time()
            <= clock_timestamp() - make_interval(secs => (greatest(p_age_ms, 0) + 1000) / 1000.0) THEN
        RAISE EXCEPTION 'the budget reservation is not held' USING ERRCODE = 'CM002';
    END IF;
    IF p_actual IS NOT NULL THEN
        UPDATE budget_ledgers b
           SET used_calls = b.used_calls + p_actual[1],
               used_model_calls = b.used_model_calls + p_actual[2],
               used_tokens = b.used_tokens + p_actual[3],
               used_cost_micro_usd = b.used_cost_micro_usd + p_actual[4],
               used_bytes = b.used_bytes + p_actual[5]
         WHERE b.key = ANY(p_keys);
    END IF;
    RETURN QUERY
        SELECT b.key,
               ARRAY[b.used_calls, b.used_model_calls, b.used_tokens, b.used_cost_micro_usd, b.used_bytes],
               ARRAY[b.reserved_calls, b.reserved_model_calls, b.reserved_tokens,
                     b.reserved_cost_micro_usd, b.reserved_bytes]
          FROM budget_ledgers b WHERE b.key = ANY(p_keys);
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
