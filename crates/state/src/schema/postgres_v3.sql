-- codemode state, PostgreSQL only, schema version 3: budget leases, so that a gated call is
-- charged in the replica's memory instead of by a statement of its own.
--
-- A lease is part of a ledger's remaining calls (and model calls) that one store (owner)
-- holds: it counts in the ledger's `reserved` like a call in flight, so no other replica can
-- grant it. The owner grants calls from it locally and reports what they spent when it
-- renews or returns the lease (codemode_fold_lease). A lease whose owner stopped renewing it
-- expires, and everything it still held is then counted as spent: the owner may have run
-- calls on it that it never reported, so its units are never granted twice (fail closed).
-- Leases are a fraction of what remains (the owner asks for 1/16), so near a limit they get
-- too small to take and every call is reserved on its own again, as in version 2.
-- Amounts (held, spent) are arrays in the order calls, model_calls, tokens, cost_micro_usd,
-- bytes; only the first two are ever leased.

CREATE TABLE budget_leases (
    id            TEXT PRIMARY KEY,
    ledger        TEXT NOT NULL,
    owner         TEXT NOT NULL,
    held          BIGINT[] NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    expired       SMALLINT NOT NULL DEFAULT 0
);
CREATE INDEX budget_leases_live ON budget_leases (ledger, expires_at_ms) WHERE expired = 0;

-- Version 2's, now also expiring leases: what a lease held when it ran out is counted as
-- spent (moved from reserved to used), and the row stays, marked, until its owner folds it.
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
    IF EXISTS (SELECT 1 FROM budget_holds
                WHERE ledger = ANY(p_keys) AND expired = 0 AND expires_at_ms <= p_now) THEN
        WITH gone AS (
            UPDATE budget_holds SET expired = 1
             WHERE ledger = ANY(p_keys) AND expired = 0 AND expires_at_ms <= p_now
            RETURNING ledger, calls, model_calls, tokens, cost_micro_usd, bytes
        ), sums AS (
            SELECT ledger, sum(calls) AS calls, sum(model_calls) AS model_calls,
                   sum(tokens) AS tokens, sum(cost_micro_usd) AS cost_micro_usd,
                   sum(bytes) AS bytes
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
    END IF;
    IF EXISTS (SELECT 1 FROM budget_leases
                WHERE ledger = ANY(p_keys) AND expired = 0 AND expires_at_ms <= p_now) THEN
        WITH gone AS (
            UPDATE budget_leases SET expired = 1
             WHERE ledger = ANY(p_keys) AND expired = 0 AND expires_at_ms <= p_now
            RETURNING ledger, held
        ), sums AS (
            SELECT ledger, sum(held[1]) AS c1, sum(held[2]) AS c2, sum(held[3]) AS c3,
                   sum(held[4]) AS c4, sum(held[5]) AS c5
              FROM gone GROUP BY ledger
        )
        UPDATE budget_ledgers b
           SET used_calls = b.used_calls + s.c1,
               used_model_calls = b.used_model_calls + s.c2,
               used_tokens = b.used_tokens + s.c3,
               used_cost_micro_usd = b.used_cost_micro_usd + s.c4,
               used_bytes = b.used_bytes + s.c5,
               reserved_calls = greatest(b.reserved_calls - s.c1, 0),
               reserved_model_calls = greatest(b.reserved_model_calls - s.c2, 0),
               reserved_tokens = greatest(b.reserved_tokens - s.c3, 0),
               reserved_cost_micro_usd = greatest(b.reserved_cost_micro_usd - s.c4, 0),
               reserved_bytes = greatest(b.reserved_bytes - s.c5, 0)
          FROM sums s
         WHERE b.key = s.ledger;
    END IF;
END;
$$;

-- On ledger p_key, locked by the caller: charges p_spent (what the owner's calls spent since
-- it last reported) and sets owner p_owner's lease p_id to hold p_held from now on (deleted
-- at zero), until p_expires. Returns 'live' (the lease holds p_held), 'gone' (returned whole),
-- 'expired' (it ran out before: what it held was counted as spent then, so only spending
-- beyond that is charged now, and the row is deleted), or 'none' (no lease named: p_spent is
-- charged as it is).
CREATE FUNCTION codemode_fold_lease(
    p_owner text, p_key text, p_id text, p_spent bigint[], p_held bigint[], p_expires bigint
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    zero CONSTANT bigint[] := ARRAY[0, 0, 0, 0, 0]::bigint[];
    old bigint[];
    gone smallint;
    charge bigint[] := p_spent;
    delta bigint[] := ARRAY[0, 0, 0, 0, 0]::bigint[];
    state text := 'none';
BEGIN
    IF p_id IS NOT NULL THEN
        SELECT l.held, l.expired INTO old, gone FROM budget_leases l
         WHERE l.id = p_id AND l.ledger = p_key AND l.owner = p_owner;
        IF FOUND AND gone = 0 THEN
            FOR c IN 1 .. 5 LOOP
                delta[c] := p_held[c] - old[c];
            END LOOP;
            IF p_held = zero THEN
                DELETE FROM budget_leases WHERE id = p_id;
                state := 'gone';
            ELSE
                UPDATE budget_leases SET held = p_held, expires_at_ms = p_expires WHERE id = p_id;
                state := 'live';
            END IF;
        ELSE
            FOR c IN 1 .. 5 LOOP
                charge[c] := greatest(p_spent[c] - coalesce(old[c], 0), 0);
            END LOOP;
            DELETE FROM budget_leases WHERE id = p_id AND owner = p_owner;
            state := 'expired';
        END IF;
    END IF;
    IF charge <> zero OR delta <> zero THEN
        UPDATE budget_ledgers b
           SET used_calls = b.used_calls + charge[1],
               used_model_calls = b.used_model_calls + charge[2],
               used_tokens = b.used_tokens + charge[3],
               used_cost_micro_usd = b.used_cost_micro_usd + charge[4],
               used_bytes = b.used_bytes + charge[5],
               reserved_calls = greatest(b.reserved_calls + delta[1], 0),
               reserved_model_calls = greatest(b.reserved_model_calls + delta[2], 0),
               reserved_tokens = greatest(b.reserved_tokens + delta[3], 0),
               reserved_cost_micro_usd = greatest(b.reserved_cost_micro_usd + delta[4], 0),
               reserved_bytes = greatest(b.reserved_bytes + delta[5], 0)
         WHERE b.key = p_key;
    END IF;
    RETURN state;
END;
$$;

-- A store that has no room left in its leases for a call on the ledgers p_keys (in byte
-- order): folds its leases on them (p_lease_ids, '' for none) down to what its calls in
-- flight hold (p_keep, 5 per key) and charges what they spent (p_spent), then, if every
-- ledger with a limit on calls or model calls has p_min times the call's amount left after
-- dividing what remains by p_divisor, leases that much on each (new leases get p_new_ids),
-- and otherwise reserves this one call as codemode_reserve does (hold p_hold_id).
-- Rows: one 'lease' row per key (its lease id or null, what it holds, the fold's state),
-- then, when the call was not leased, a 'hold' row (granted) or a 'refused' row (the first
-- ledger and counter without room).
CREATE FUNCTION codemode_lease_take(
    p_owner text, p_keys text[], p_limits bigint[], p_amounts bigint[], p_now bigint,
    p_lease_ids text[], p_new_ids text[], p_spent bigint[], p_keep bigint[],
    p_divisor bigint, p_min bigint, p_lease_expires bigint, p_hold_id text, p_hold_expires bigint
) RETURNS TABLE (kind text, key text, lease_id text, held bigint[], state text,
                 refused_counter int, used bigint, reserved bigint, lim bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    zero CONSTANT bigint[] := ARRAY[0, 0, 0, 0, 0]::bigint[];
    n int := cardinality(p_keys);
    ids text[] := p_lease_ids;
    states text[] := array_fill(''::text, ARRAY[n]);
    sizes bigint[] := array_fill(0::bigint, ARRAY[n * 5]);
    s bigint[];
    u bigint[];
    r bigint[];
    l bigint;
    want numeric;
    leasing boolean := p_divisor > 0;
BEGIN
    PERFORM codemode_lock_ledgers(p_keys, p_now);
    FOR i IN 1 .. n LOOP
        states[i] := codemode_fold_lease(p_owner, p_keys[i], nullif(ids[i], ''),
                                         p_spent[(i - 1) * 5 + 1 : i * 5],
                                         p_keep[(i - 1) * 5 + 1 : i * 5], p_lease_expires);
        IF states[i] <> 'live' THEN
            ids[i] := NULL;
        END IF;
    END LOOP;
    FOR i IN 1 .. n LOOP
        SELECT ARRAY[b.used_calls, b.used_model_calls, b.used_tokens, b.used_cost_micro_usd, b.used_bytes],
               ARRAY[b.reserved_calls, b.reserved_model_calls, b.reserved_tokens,
                     b.reserved_cost_micro_usd, b.reserved_bytes]
          INTO u, r FROM budget_ledgers b WHERE b.key = p_keys[i];
        FOR c IN 1 .. 5 LOOP
            l := p_limits[(i - 1) * 5 + c];
            CONTINUE WHEN l < 0;
            IF c > 2 THEN
                -- Tokens, cost and bytes are known only after a call: never leased.
                leasing := false;
                CONTINUE;
            END IF;
            want := floor((l::numeric - u[c] - r[c]) / greatest(p_divisor, 1));
            IF want < p_min * greatest(p_amounts[c], 1) THEN
                leasing := false;
            ELSE
                sizes[(i - 1) * 5 + c] := want::bigint;
            END IF;
        END LOOP;
    END LOOP;
    IF leasing THEN
        FOR i IN 1 .. n LOOP
            s := sizes[(i - 1) * 5 + 1 : i * 5];
            CONTINUE WHEN s = zero;
            IF ids[i] IS NOT NULL THEN
                UPDATE budget_leases l
                   SET held = ARRAY[l.held[1] + s[1], l.held[2] + s[2], l.held[3], l.held[4], l.held[5]],
                       expires_at_ms = p_lease_expires
                 WHERE l.id = ids[i];
            ELSE
                ids[i] := p_new_ids[i];
                INSERT INTO budget_leases (id, ledger, owner, held, expires_at_ms)
                VALUES (ids[i], p_keys[i], p_owner, s, p_lease_expires);
            END IF;
            UPDATE budget_ledgers b
               SET reserved_calls = b.reserved_calls + s[1],
                   reserved_model_calls = b.reserved_model_calls + s[2]
             WHERE b.key = p_keys[i];
        END LOOP;
    ELSE
        IF (SELECT bool_and(coalesce(x, '') = '') FROM unnest(p_lease_ids) AS t(x))
           AND (SELECT bool_and(x = 0) FROM unnest(p_spent) AS t(x)) THEN
            -- Only this call's hold is written: as version 2's reservation, it need not wait
            -- for the disk (see codemode_reserve with p_durable).
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        RETURN QUERY
            SELECT 'refused'::text, f.refused_key, NULL::text, NULL::bigint[], NULL::text,
                   f.refused_counter, f.used, f.reserved, f.lim
              FROM codemode_reserve(p_hold_id, p_keys, p_limits, p_amounts, p_now, p_hold_expires) f;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'hold'::text, NULL::text, NULL::text, NULL::bigint[], NULL::text,
                                NULL::int, NULL::bigint, NULL::bigint, NULL::bigint;
        END IF;
    END IF;
    RETURN QUERY
        SELECT 'lease'::text, t.k, t.id, coalesce(l.held, zero), t.st,
               NULL::int, NULL::bigint, NULL::bigint, NULL::bigint
          FROM unnest(p_keys, ids, states) AS t(k, id, st)
          LEFT JOIN budget_leases l ON l.id = t.id;
END;
$$;

-- Renews or returns leases of p_owner and charges what was spent, off the call path: for each
-- key (in byte order), codemode_fold_lease with its slice of p_spent and p_held. Ledger rows
-- that do not exist yet are created. Rows: each key, the fold's state and the ledger's used
-- counters afterwards.
CREATE FUNCTION codemode_lease_sync(
    p_owner text, p_keys text[], p_lease_ids text[], p_spent bigint[], p_held bigint[],
    p_now bigint, p_expires bigint
) RETURNS TABLE (key text, state text, used bigint[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    st text;
BEGIN
    INSERT INTO budget_ledgers (key) SELECT k FROM unnest(p_keys) AS t(k) ORDER BY k COLLATE "C"
        ON CONFLICT (key) DO NOTHING;
    PERFORM codemode_lock_ledgers(p_keys, p_now);
    FOR i IN 1 .. cardinality(p_keys) LOOP
        st := codemode_fold_lease(p_owner, p_keys[i], nullif(p_lease_ids[i], ''),
                                  p_spent[(i - 1) * 5 + 1 : i * 5],
                                  p_held[(i - 1) * 5 + 1 : i * 5], p_expires);
        RETURN QUERY
            SELECT p_keys[i], st,
                   ARRAY[b.used_calls, b.used_model_calls, b.used_tokens, b.used_cost_micro_usd,
                         b.used_bytes]
              FROM budget_ledgers b WHERE b.key = p_keys[i];
    END LOOP;
END;
$$;
