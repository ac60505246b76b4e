-- codemode state, PostgreSQL only, schema version 1: budget charging in one statement each.
--
-- A reservation decides on locked ledger rows. Done from the client, the rows stay locked
-- across round trips; in these functions they stay locked only while the function runs, so
-- calls that share a ledger (a session's, a team's day) queue for microseconds, not for
-- network round trips. The rules are those of codemode_state::budget (check_room, and holds
-- that expire), which the memory and SQLite backends run in Rust; the shared test suite holds
-- all three to the same behaviour. Amounts are arrays in the order calls, model_calls,
-- tokens, cost_micro_usd, bytes; a limit of -1 is no limit.

-- Locks the ledgers in byte order of their keys, and gives back holds that ran out.
-- Raises CM001 when a ledger row is missing (the caller creates it and retries).
CREATE FUNCTION codemode_lock_ledgers(p_keys text[], p_now bigint) RETURNS void
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

-- Holds p_amounts on every ledger of p_keys (limits: 5 per key, in p_keys' order), or on
-- none. Returns no row when granted, or the first ledger and counter (1-based) without room.
CREATE FUNCTION codemode_reserve(
    p_id text, p_keys text[], p_limits bigint[], p_amounts bigint[], p_now bigint, p_expires bigint
) RETURNS TABLE (refused_key text, refused_counter int, used bigint, reserved bigint, lim bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    u bigint[];
    r bigint[];
    l bigint;
    taken numeric;
BEGIN
    PERFORM codemode_lock_ledgers(p_keys, p_now);
    FOR i IN 1 .. cardinality(p_keys) LOOP
        SELECT ARRAY[b.used_calls, b.used_model_calls, b.used_tokens, b.used_cost_micro_usd, b.used_bytes],
               ARRAY[b.reserved_calls, b.reserved_model_calls, b.reserved_tokens,
                     b.reserved_cost_micro_usd, b.reserved_bytes]
          INTO u, r FROM budget_ledgers b WHERE b.key = p_keys[i];
        FOR c IN 1 .. 5 LOOP
            l := p_limits[(i - 1) * 5 + c];
            CONTINUE WHEN l < 0;
            taken := u[c]::numeric + r[c];
            IF taken >= l OR taken + p_amounts[c] > l THEN
                RETURN QUERY SELECT p_keys[i], c, u[c], r[c], l;
                RETURN;
            END IF;
        END LOOP;
    END LOOP;
    UPDATE budget_ledgers
       SET reserved_calls = reserved_calls + p_amounts[1],
           reserved_model_calls = reserved_model_calls + p_amounts[2],
           reserved_tokens = reserved_tokens + p_amounts[3],
           reserved_cost_micro_usd = reserved_cost_micro_usd + p_amounts[4],
           reserved_bytes = reserved_bytes + p_amounts[5]
     WHERE key = ANY(p_keys);
    INSERT INTO budget_holds (id, ledger, calls, model_calls, tokens, cost_micro_usd, bytes, expires_at_ms)
    SELECT p_id, k, p_amounts[1], p_amounts[2], p_amounts[3], p_amounts[4], p_amounts[5], p_expires
      FROM unnest(p_keys) AS t(k);
END;
$$;

-- Ends hold p_id on the ledgers p_keys: gives back what it still holds and, when p_actual is
-- not null (settle), charges p_actual to every one of them. Returns each ledger afterwards.
-- Raises CM002 when the hold is not there (already settled or released).
CREATE FUNCTION codemode_finish_hold(p_id text, p_keys text[], p_actual bigint[], p_now bigint)
RETURNS TABLE (key text, used bigint[], reserved bigint[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n int;
BEGIN
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
    IF n = 0 THEN
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
