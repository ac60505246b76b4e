//! Budget ledgers: what a script, a session, or a principal or team in one day has spent.
//!
//! A call is charged in two steps so that concurrent calls cannot overspend:
//! 1. [`reserve`](crate::StateStore::reserve) checks every ledger the call counts against and
//!    holds its expected amount on all of them, or on none (one transaction, the ledgers' rows
//!    locked in key order, so no read-then-write race and no deadlock);
//! 2. [`settle`](crate::StateStore::settle) replaces the hold with what the call really spent,
//!    or [`release`](crate::StateStore::release) drops it when the call did not run.
//!
//! A hold expires (`hold_for`) so that a replica that dies mid-call does not keep budget forever;
//! settling an expired hold still charges what was spent.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Result, StateError};
use crate::validate::check_id;

/// Whose spending a ledger counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LedgerScope {
    Script,
    Session,
    Principal,
    Team,
}

impl LedgerScope {
    pub fn as_str(self) -> &'static str {
        match self {
            LedgerScope::Script => "script",
            LedgerScope::Session => "session",
            LedgerScope::Principal => "principal",
            LedgerScope::Team => "team",
        }
    }

    #[cfg(test)]
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "script" => LedgerScope::Script,
            "session" => LedgerScope::Session,
            "principal" => LedgerScope::Principal,
            "team" => LedgerScope::Team,
            _ => return None,
        })
    }
}

/// One ledger: a scope, an id in it, and for per-day ledgers the UTC day (`YYYY-MM-DD`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LedgerKey {
    pub scope: LedgerScope,
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub day: Option<String>,
}

impl LedgerKey {
    pub fn script(id: impl Into<String>) -> Self {
        LedgerKey {
            scope: LedgerScope::Script,
            id: id.into(),
            day: None,
        }
    }

    pub fn session(id: impl Into<String>) -> Self {
        LedgerKey {
            scope: LedgerScope::Session,
            id: id.into(),
            day: None,
        }
    }

    /// A principal's ledger for one UTC day ([`crate::utc_day`] makes `day`).
    pub fn principal_day(id: impl Into<String>, day: impl Into<String>) -> Self {
        LedgerKey {
            scope: LedgerScope::Principal,
            id: id.into(),
            day: Some(day.into()),
        }
    }

    /// A team's ledger for one UTC day.
    pub fn team_day(id: impl Into<String>, day: impl Into<String>) -> Self {
        LedgerKey {
            scope: LedgerScope::Team,
            id: id.into(),
            day: Some(day.into()),
        }
    }

    /// The text the backends store and lock rows by: `scope|day|id`. Scope and day never
    /// contain `|`, so the id (which may) is whatever follows the second one.
    pub(crate) fn encode(&self) -> String {
        format!(
            "{}|{}|{}",
            self.scope.as_str(),
            self.day.as_deref().unwrap_or(""),
            self.id
        )
    }

    #[cfg(test)]
    fn decode(s: &str) -> Option<Self> {
        let mut parts = s.splitn(3, '|');
        let scope = LedgerScope::parse(parts.next()?)?;
        let day = parts.next()?;
        let id = parts.next()?;
        Some(LedgerKey {
            scope,
            id: id.to_string(),
            day: (!day.is_empty()).then(|| day.to_string()),
        })
    }

    pub(crate) fn validate(&self) -> Result<()> {
        check_id("ledger id", &self.id)?;
        if let Some(day) = &self.day {
            let ok = day.len() == 10
                && day.bytes().enumerate().all(|(i, b)| {
                    if i == 4 || i == 7 {
                        b == b'-'
                    } else {
                        b.is_ascii_digit()
                    }
                });
            if !ok {
                return Err(StateError::invalid(
                    "ledger day",
                    format!(
                        "`{day}` is not a UTC day like 2026-12-02 (use codemode_state::utc_day)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for LedgerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.day {
            Some(day) => write!(f, "{} `{}` on {day}", self.scope.as_str(), self.id),
            None => write!(f, "{} `{}`", self.scope.as_str(), self.id),
        }
    }
}

/// Quantities a ledger counts. Cost is in micro-USD so that sums are exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amounts {
    pub calls: u64,
    pub model_calls: u64,
    pub tokens: u64,
    pub cost_micro_usd: u64,
    pub bytes: u64,
}

/// The counters of [`Amounts`], to name the one a refusal is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Counter {
    Calls,
    ModelCalls,
    Tokens,
    CostMicroUsd,
    Bytes,
}

impl Counter {
    pub const ALL: [Counter; 5] = [
        Counter::Calls,
        Counter::ModelCalls,
        Counter::Tokens,
        Counter::CostMicroUsd,
        Counter::Bytes,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Counter::Calls => "calls",
            Counter::ModelCalls => "model_calls",
            Counter::Tokens => "tokens",
            Counter::CostMicroUsd => "cost_micro_usd",
            Counter::Bytes => "bytes",
        }
    }
}

impl Amounts {
    pub fn get(&self, c: Counter) -> u64 {
        match c {
            Counter::Calls => self.calls,
            Counter::ModelCalls => self.model_calls,
            Counter::Tokens => self.tokens,
            Counter::CostMicroUsd => self.cost_micro_usd,
            Counter::Bytes => self.bytes,
        }
    }

    fn get_mut(&mut self, c: Counter) -> &mut u64 {
        match c {
            Counter::Calls => &mut self.calls,
            Counter::ModelCalls => &mut self.model_calls,
            Counter::Tokens => &mut self.tokens,
            Counter::CostMicroUsd => &mut self.cost_micro_usd,
            Counter::Bytes => &mut self.bytes,
        }
    }

    pub(crate) fn plus(&self, other: &Amounts) -> Amounts {
        let mut out = *self;
        for c in Counter::ALL {
            *out.get_mut(c) = self.get(c).saturating_add(other.get(c));
        }
        out
    }

    pub(crate) fn minus(&self, other: &Amounts) -> Amounts {
        let mut out = *self;
        for c in Counter::ALL {
            *out.get_mut(c) = self.get(c).saturating_sub(other.get(c));
        }
        out
    }

    /// The databases store counters as signed 64-bit integers.
    pub(crate) fn validate(&self, what: &'static str) -> Result<()> {
        for c in Counter::ALL {
            if self.get(c) > i64::MAX as u64 {
                return Err(StateError::invalid(
                    what,
                    format!(
                        "{} is {}, above the largest storable {}",
                        c.as_str(),
                        self.get(c),
                        i64::MAX
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn to_i64s(self) -> [i64; 5] {
        Counter::ALL.map(|c| i64::try_from(self.get(c)).unwrap_or(i64::MAX))
    }

    pub(crate) fn from_i64s(v: [i64; 5]) -> Amounts {
        let mut out = Amounts::default();
        for (c, x) in Counter::ALL.into_iter().zip(v) {
            *out.get_mut(c) = u64::try_from(x).unwrap_or(0);
        }
        out
    }
}

/// Ceilings for one ledger; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micro_usd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl Limits {
    pub fn get(&self, c: Counter) -> Option<u64> {
        match c {
            Counter::Calls => self.calls,
            Counter::ModelCalls => self.model_calls,
            Counter::Tokens => self.tokens,
            Counter::CostMicroUsd => self.cost_micro_usd,
            Counter::Bytes => self.bytes,
        }
    }
}

/// A ledger as stored: what was spent, and what open reservations hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerSnapshot {
    pub key: LedgerKey,
    pub used: Amounts,
    pub reserved: Amounts,
}

/// Hold `amounts` on every ledger in `ledgers` (each with its own limits), all or none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReserveRequest {
    pub ledgers: Vec<(LedgerKey, Limits)>,
    pub amounts: Amounts,
    /// How long the hold lasts if it is never settled or released (a replica died mid-call).
    pub hold_for: Duration,
}

impl ReserveRequest {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.ledgers.is_empty() {
            return Err(StateError::invalid(
                "budget reservation",
                "it names no ledger; name at least one (the script's or the session's)",
            ));
        }
        let mut keys: Vec<&LedgerKey> = self.ledgers.iter().map(|(k, _)| k).collect();
        keys.sort();
        for pair in keys.windows(2) {
            if pair[0] == pair[1] {
                return Err(StateError::invalid(
                    "budget reservation",
                    format!("ledger {} is named twice; name each ledger once", pair[0]),
                ));
            }
        }
        for k in keys {
            k.validate()?;
        }
        self.amounts.validate("budget reservation")
    }

    /// The ledgers in the order backends lock them (by encoded key), with their limits.
    pub(crate) fn sorted(&self) -> Vec<(String, &LedgerKey, &Limits)> {
        let mut v: Vec<_> = self
            .ledgers
            .iter()
            .map(|(k, l)| (k.encode(), k, l))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// A granted hold; pass it back to settle or release it. It serializes, so it may be kept
/// with the call it pays for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reservation {
    pub id: String,
    pub ledgers: Vec<(LedgerKey, Limits)>,
    pub amounts: Amounts,
    pub expires_at_ms: i64,
    /// When it was made, by the system clock of the process that made it (0 when unknown).
    /// PostgreSQL uses it to tell a hold lost in a server restart from one already settled.
    #[serde(default)]
    pub reserved_at_ms: i64,
    /// Set when the call was granted from budget leases the store holds (PostgreSQL): that
    /// store settles it in its memory and reports the spending with the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseTicket>,
}

/// Which store's leases a reservation was granted from, and which generation of the lease on
/// each of its ledgers (in key order): a lease lost or expired since is a new generation, and
/// the calls granted from the old one were counted as spent when it ran out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTicket {
    pub owner: String,
    pub generations: Vec<u64>,
}

impl Reservation {
    pub(crate) fn sorted_keys(&self) -> Vec<String> {
        let mut v: Vec<String> = self.ledgers.iter().map(|(k, _)| k.encode()).collect();
        v.sort();
        v
    }
}

/// Why a reservation was refused: the first ledger and counter that had no room.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetRefusal {
    pub ledger: LedgerKey,
    pub counter: Counter,
    pub used: u64,
    pub reserved: u64,
    pub limit: u64,
    pub amount: u64,
}

impl std::fmt::Display for BudgetRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the {} budget for {} is used up ({} used and {} held by calls in flight, of {}); the call was not run",
            self.counter.as_str(),
            self.ledger,
            self.used,
            self.reserved,
            self.limit
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum ReserveOutcome {
    Granted(Reservation),
    Refused(BudgetRefusal),
}

/// A ledger whose spending passed a limit once the actual amounts were charged (a call's cost
/// is known only after it ran; the call's result may then be withheld).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overrun {
    pub ledger: LedgerKey,
    pub counter: Counter,
    pub used: u64,
    pub limit: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettleOutcome {
    /// Every ledger of the reservation after the charge, in key order; empty for a call
    /// settled against a PostgreSQL budget lease (charged in memory, reported to the ledger
    /// within a second; its `overruns` are still exact).
    pub ledgers: Vec<LedgerSnapshot>,
    pub overruns: Vec<Overrun>,
}

/// Whether `amount` fits on a ledger. A limit is a ceiling not to be reached before the call: a
/// counter with a limit refuses when nothing is left (`used + reserved >= limit`, so a call of
/// unknown cost, amount 0, is refused once the budget is spent) or when the amount does not
/// fit (`used + reserved + amount > limit`).
pub(crate) fn check_room(
    key: &LedgerKey,
    used: &Amounts,
    reserved: &Amounts,
    limits: &Limits,
    amount: &Amounts,
) -> Result<(), BudgetRefusal> {
    for c in Counter::ALL {
        let Some(limit) = limits.get(c) else { continue };
        let taken = used.get(c).saturating_add(reserved.get(c));
        if taken >= limit || taken.saturating_add(amount.get(c)) > limit {
            return Err(BudgetRefusal {
                ledger: key.clone(),
                counter: c,
                used: used.get(c),
                reserved: reserved.get(c),
                limit,
                amount: amount.get(c),
            });
        }
    }
    Ok(())
}

/// The overruns of one ledger after settling.
pub(crate) fn overruns(key: &LedgerKey, used: &Amounts, limits: &Limits) -> Vec<Overrun> {
    Counter::ALL
        .into_iter()
        .filter_map(|c| {
            let limit = limits.get(c)?;
            (used.get(c) > limit).then(|| Overrun {
                ledger: key.clone(),
                counter: c,
                used: used.get(c),
                limit,
            })
        })
        .collect()
}

pub(crate) fn hold_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_keys_round_trip_even_with_bars_in_the_id() {
        for k in [
            LedgerKey::script("s|1"),
            LedgerKey::session("a"),
            LedgerKey::principal_day("alice|bob", "2026-12-02"),
            LedgerKey::team_day("t", "2026-01-31"),
        ] {
            assert_eq!(LedgerKey::decode(&k.encode()), Some(k));
        }
        assert!(
            LedgerKey::principal_day("x", "2026-1-2")
                .validate()
                .is_err()
        );
    }

    #[test]
    fn room_is_checked_against_used_plus_held() {
        let k = LedgerKey::session("s");
        let limits = Limits {
            calls: Some(10),
            tokens: Some(100),
            ..Limits::default()
        };
        let one_call = Amounts {
            calls: 1,
            ..Amounts::default()
        };
        let used = Amounts {
            calls: 4,
            ..Amounts::default()
        };
        let held = Amounts {
            calls: 5,
            ..Amounts::default()
        };
        assert!(check_room(&k, &used, &held, &limits, &one_call).is_ok());
        let held = Amounts {
            calls: 6,
            ..Amounts::default()
        };
        let r = check_room(&k, &used, &held, &limits, &one_call).unwrap_err();
        assert_eq!(
            (r.counter, r.used, r.reserved, r.limit),
            (Counter::Calls, 4, 6, 10)
        );
        // Tokens of unknown amount: refused only once the ceiling is reached.
        let spent = Amounts {
            tokens: 100,
            ..Amounts::default()
        };
        let r = check_room(&k, &spent, &Amounts::default(), &limits, &one_call).unwrap_err();
        assert_eq!(r.counter, Counter::Tokens);
    }
}
