//! The bridge protocol between the host and a worker process: small, versioned, bounded.
//!
//! Every message is one frame: a little-endian `u32` length, then that many bytes, the first of
//! which is the message tag. Fields are fixed-width integers and length-prefixed UTF-8 strings.
//! The host decodes everything a worker sends as hostile input: every length is checked against
//! what is left of the frame, every string is validated as UTF-8, unknown tags are errors, and the
//! frame length itself is capped before anything is allocated.

use crate::host::{HostCallKind, HostError};
use crate::result::OutputItem;

/// Bumped whenever a message changes shape. The worker announces it in [`ToHost::Hello`]; a host
/// that sees another number stops the worker instead of guessing.
pub(crate) const PROTOCOL_VERSION: u32 = 2;

/// The limits of one script that the worker enforces inside the VM.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VmLimits {
    pub heap_bytes: u64,
    pub stack_bytes: u64,
    pub cpu_ms: u64,
    pub max_output_chars: u64,
    pub max_output_items: u64,
    pub max_calls: u64,
    pub max_calls_in_flight: u64,
}

/// What a worker needs to run one script.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Start {
    pub limits: VmLimits,
    /// The prelude's `init` configuration (tools, globals, store, output limits, determinism).
    pub config: String,
    pub code: String,
    /// Send [`ToHost::Idle`] at the end of each turn (the host needs it to replay a log).
    pub notify_idle: bool,
    /// Results may resolve in place (see [`ToHost::Call::waits`]); false in deterministic runs,
    /// whose results come turn by turn.
    pub in_place: bool,
}

/// How the script's VM ended, as the worker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The script reported a result (`Finish::value`/`writes`) or an error (`Finish::desc`).
    Reported,
    Timeout,
    Cpu,
    Aborted,
    /// Waiting on a promise that nothing can settle.
    Stalled,
    /// The engine gave up (`Finish::fatal` says why).
    Fatal,
}

/// The last message of a script.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Finish {
    pub end: Option<End>,
    /// True when the script returned or called `exit()`; false when it threw.
    pub ok: bool,
    pub value: Option<String>,
    pub writes: Option<String>,
    pub desc: Option<String>,
    pub fatal: Option<String>,
    /// The VM hit its heap limit at some point.
    pub oom: bool,
    /// The script source could not be compiled for lack of memory.
    pub oom_compiling: bool,
}

/// One call result on its way into the VM.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Delivery {
    pub id: u64,
    pub result: Result<String, HostError>,
    /// Virtual `Date.now()` of a deterministic run.
    pub at_ms: Option<f64>,
}

/// Host to worker.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToWorker {
    Start(Box<Start>),
    Deliver(Delivery),
    /// The call with this id, which waits in place, was not answered at once: its result
    /// comes later as a [`ToWorker::Deliver`].
    Later(u64),
    Shutdown,
}

/// Worker to host.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToHost {
    /// First message of a worker: its protocol version and the isolation layers it runs under.
    Hello {
        version: u32,
        layers: String,
    },
    Call {
        id: u64,
        kind: HostCallKind,
        name: String,
        args: String,
        /// The VM waits for this call's answer before it goes on: the host answers at once, or
        /// says [`ToWorker::Later`].
        waits: bool,
    },
    Output(OutputItem),
    /// The VM ran out of work and waits for results (the end of one event-loop turn).
    Idle,
    Finished(Box<Finish>),
}

/// A frame the host refuses. The worker that sent it is stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct DecodeError(pub String);

fn bad<T>(what: impl Into<String>) -> Result<T, DecodeError> {
    Err(DecodeError(what.into()))
}

// ---- encoding ----

/// Builds one frame in a reusable buffer. The length prefix is filled in by [`Frame::finish`].
pub(crate) struct Frame<'a>(&'a mut Vec<u8>);

impl<'a> Frame<'a> {
    pub fn new(buf: &'a mut Vec<u8>, tag: u8) -> Frame<'a> {
        buf.clear();
        buf.extend_from_slice(&[0, 0, 0, 0, tag]);
        Frame(buf)
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn f64(&mut self, v: f64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
    pub fn opt_str(&mut self, s: Option<&str>) -> &mut Self {
        match s {
            Some(s) => self.u8(1).str(s),
            None => self.u8(0),
        }
    }
    /// Writes the length prefix; the buffer then holds the whole frame.
    pub fn finish(self) {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_le_bytes());
    }
}

const H_START: u8 = 1;
const H_DELIVER: u8 = 2;
const H_SHUTDOWN: u8 = 3;
const H_LATER: u8 = 4;

const W_HELLO: u8 = 1;
const W_CALL: u8 = 2;
const W_OUTPUT: u8 = 3;
const W_IDLE: u8 = 4;
const W_FINISHED: u8 = 5;

/// Encodes a host-to-worker message into `buf` (cleared first).
pub(crate) fn encode_to_worker(msg: &ToWorker, buf: &mut Vec<u8>) {
    match msg {
        ToWorker::Start(s) => {
            let mut f = Frame::new(buf, H_START);
            let l = &s.limits;
            f.u64(l.heap_bytes)
                .u64(l.stack_bytes)
                .u64(l.cpu_ms)
                .u64(l.max_output_chars)
                .u64(l.max_output_items)
                .u64(l.max_calls)
                .u64(l.max_calls_in_flight)
                .u8(u8::from(s.notify_idle))
                .u8(u8::from(s.in_place))
                .str(&s.config)
                .str(&s.code);
            f.finish();
        }
        ToWorker::Deliver(d) => encode_delivery(d, buf),
        ToWorker::Later(id) => {
            let mut f = Frame::new(buf, H_LATER);
            f.u64(*id);
            f.finish();
        }
        ToWorker::Shutdown => Frame::new(buf, H_SHUTDOWN).finish(),
    }
}

/// A delivery on its own, so the host can encode results without building a [`ToWorker`].
pub(crate) fn encode_delivery(d: &Delivery, buf: &mut Vec<u8>) {
    let mut f = Frame::new(buf, H_DELIVER);
    f.u64(d.id);
    match d.at_ms {
        Some(t) => f.u8(1).f64(t),
        None => f.u8(0),
    };
    match &d.result {
        Ok(json) => {
            f.u8(1).str(json);
        }
        Err(e) => {
            let props = if e.properties.is_empty() {
                None
            } else {
                serde_json::to_string(&e.properties).ok()
            };
            f.u8(0)
                .str(&e.message)
                .opt_str(e.name.as_deref())
                .opt_str(props.as_deref());
        }
    }
    f.finish();
}

/// Encodes a worker-to-host message into `buf` (cleared first).
pub(crate) fn encode_to_host(msg: &ToHost, buf: &mut Vec<u8>) {
    match msg {
        ToHost::Hello { version, layers } => {
            let mut f = Frame::new(buf, W_HELLO);
            f.u32(*version).str(layers);
            f.finish();
        }
        ToHost::Call {
            id,
            kind,
            name,
            args,
            waits,
        } => encode_call(*id, *kind, name, args, *waits, buf),
        ToHost::Output(item) => {
            let mut f = Frame::new(buf, W_OUTPUT);
            match item {
                OutputItem::Text { text, console } => {
                    f.u8(u8::from(*console)).str(text).opt_str(None);
                }
                OutputItem::Image { data, mime_type } => {
                    f.u8(2).str(data).opt_str(Some(mime_type));
                }
            }
            f.finish();
        }
        ToHost::Idle => Frame::new(buf, W_IDLE).finish(),
        ToHost::Finished(fin) => {
            let mut f = Frame::new(buf, W_FINISHED);
            let end = match fin.end {
                None => 0,
                Some(End::Reported) => 1,
                Some(End::Timeout) => 2,
                Some(End::Cpu) => 3,
                Some(End::Aborted) => 4,
                Some(End::Stalled) => 5,
                Some(End::Fatal) => 6,
            };
            f.u8(end)
                .u8(u8::from(fin.ok))
                .u8(u8::from(fin.oom))
                .u8(u8::from(fin.oom_compiling))
                .opt_str(fin.value.as_deref())
                .opt_str(fin.writes.as_deref())
                .opt_str(fin.desc.as_deref())
                .opt_str(fin.fatal.as_deref());
            f.finish();
        }
    }
}

/// A call on its own: the hot path, encoded without building a [`ToHost`].
pub(crate) fn encode_call(
    id: u64,
    kind: HostCallKind,
    name: &str,
    args: &str,
    waits: bool,
    buf: &mut Vec<u8>,
) {
    let mut f = Frame::new(buf, W_CALL);
    f.u64(id)
        .u8(match kind {
            HostCallKind::Tool => 0,
            HostCallKind::Global => 1,
        })
        .u8(u8::from(waits))
        .str(name)
        .str(args);
    f.finish();
}

// ---- decoding ----

/// Reads fields from one frame's payload (without the length prefix), never past its end.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| DecodeError("a field runs past the end of its message".into()))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub fn f64(&mut self) -> Result<f64, DecodeError> {
        Ok(f64::from_bits(self.u64()?))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub fn str(&mut self) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.bytes()?)
            .map_err(|_| DecodeError("a text field is not valid UTF-8".into()))
    }
    pub fn opt_str(&mut self) -> Result<Option<&'a str>, DecodeError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.str().map(Some),
            other => bad(format!("an optional field has the flag {other}")),
        }
    }
    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => bad(format!("a flag has the value {other}")),
        }
    }
    pub fn end(&self) -> Result<(), DecodeError> {
        if self.at == self.buf.len() {
            Ok(())
        } else {
            bad("a message has bytes after its last field")
        }
    }
}

/// Decodes a worker's frame payload. Every error means the worker is broken or hostile.
pub(crate) fn decode_to_host(payload: &[u8]) -> Result<ToHost, DecodeError> {
    let mut r = Reader::new(payload);
    let msg = match r.u8()? {
        W_HELLO => ToHost::Hello {
            version: r.u32()?,
            layers: r.str()?.to_string(),
        },
        W_CALL => {
            let id = r.u64()?;
            let kind = match r.u8()? {
                0 => HostCallKind::Tool,
                1 => HostCallKind::Global,
                other => return bad(format!("a call has the unknown kind {other}")),
            };
            let waits = r.bool()?;
            ToHost::Call {
                id,
                kind,
                waits,
                name: r.str()?.to_string(),
                args: r.str()?.to_string(),
            }
        }
        W_OUTPUT => {
            let kind = r.u8()?;
            let text = r.str()?.to_string();
            let mime = r.opt_str()?;
            ToHost::Output(match (kind, mime) {
                (0 | 1, None) => OutputItem::Text {
                    text,
                    console: kind == 1,
                },
                (2, Some(m)) => OutputItem::Image {
                    data: text,
                    mime_type: m.to_string(),
                },
                _ => return bad(format!("an output item has the unknown kind {kind}")),
            })
        }
        W_IDLE => ToHost::Idle,
        W_FINISHED => {
            let end = match r.u8()? {
                0 => None,
                1 => Some(End::Reported),
                2 => Some(End::Timeout),
                3 => Some(End::Cpu),
                4 => Some(End::Aborted),
                5 => Some(End::Stalled),
                6 => Some(End::Fatal),
                other => return bad(format!("a script ended in the unknown way {other}")),
            };
            ToHost::Finished(Box::new(Finish {
                end,
                ok: r.bool()?,
                oom: r.bool()?,
                oom_compiling: r.bool()?,
                value: r.opt_str()?.map(str::to_string),
                writes: r.opt_str()?.map(str::to_string),
                desc: r.opt_str()?.map(str::to_string),
                fatal: r.opt_str()?.map(str::to_string),
            }))
        }
        other => return bad(format!("unknown message tag {other}")),
    };
    r.end()?;
    Ok(msg)
}

/// Decodes a host frame payload (in the worker; the host is trusted, but a bad frame still ends
/// the worker cleanly rather than being misread).
pub(crate) fn decode_to_worker(payload: &[u8]) -> Result<ToWorker, DecodeError> {
    let mut r = Reader::new(payload);
    let msg = match r.u8()? {
        H_START => {
            let limits = VmLimits {
                heap_bytes: r.u64()?,
                stack_bytes: r.u64()?,
                cpu_ms: r.u64()?,
                max_output_chars: r.u64()?,
                max_output_items: r.u64()?,
                max_calls: r.u64()?,
                max_calls_in_flight: r.u64()?,
            };
            let notify_idle = r.bool()?;
            let in_place = r.bool()?;
            ToWorker::Start(Box::new(Start {
                limits,
                notify_idle,
                in_place,
                config: r.str()?.to_string(),
                code: r.str()?.to_string(),
            }))
        }
        H_DELIVER => {
            let id = r.u64()?;
            let at_ms = if r.bool()? { Some(r.f64()?) } else { None };
            let result = if r.bool()? {
                Ok(r.str()?.to_string())
            } else {
                let message = r.str()?.to_string();
                let name = r.opt_str()?.map(str::to_string);
                let properties = match r.opt_str()? {
                    Some(p) => serde_json::from_str(p).unwrap_or_default(),
                    None => Default::default(),
                };
                Err(HostError {
                    message,
                    name,
                    properties,
                })
            };
            ToWorker::Deliver(Delivery { id, result, at_ms })
        }
        H_LATER => ToWorker::Later(r.u64()?),
        H_SHUTDOWN => ToWorker::Shutdown,
        other => return bad(format!("unknown message tag {other}")),
    };
    r.end()?;
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_host(m: ToHost) {
        let mut buf = Vec::new();
        encode_to_host(&m, &mut buf);
        let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        assert_eq!(len, buf.len() - 4);
        assert_eq!(decode_to_host(&buf[4..]).unwrap(), m);
    }

    #[test]
    fn messages_round_trip() {
        round_host(ToHost::Hello {
            version: 1,
            layers: "{}".into(),
        });
        round_host(ToHost::Call {
            id: 7,
            kind: HostCallKind::Global,
            name: "models.classify".into(),
            args: "[1]".into(),
            waits: true,
        });
        round_host(ToHost::Output(OutputItem::Image {
            data: "iVBOR".into(),
            mime_type: "image/png".into(),
        }));
        round_host(ToHost::Finished(Box::new(Finish {
            end: Some(End::Reported),
            ok: true,
            value: Some("1".into()),
            ..Default::default()
        })));
        let mut buf = Vec::new();
        let d = Delivery {
            id: 3,
            result: Err(HostError::new("no")),
            at_ms: Some(5.0),
        };
        encode_delivery(&d, &mut buf);
        assert_eq!(decode_to_worker(&buf[4..]).unwrap(), ToWorker::Deliver(d));
        for m in [ToWorker::Later(9), ToWorker::Shutdown] {
            encode_to_worker(&m, &mut buf);
            assert_eq!(decode_to_worker(&buf[4..]).unwrap(), m);
        }
    }

    #[test]
    fn hostile_frames_are_errors_not_panics() {
        for payload in [
            &[][..],
            &[99],
            &[W_CALL, 1, 0],
            &[W_CALL, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255],
            // A waiting flag that is neither 0 nor 1.
            &[W_CALL, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0],
            &[W_OUTPUT, 0, 2, 0, 0, 0, 0xff, 0xfe, 0],
            &[W_IDLE, 0],
            &[W_FINISHED, 9],
        ] {
            assert!(decode_to_host(payload).is_err(), "{payload:?}");
        }
    }
}
