// Evaluated once per VM, before any script is known, as a sloppy-mode expression that yields a
// function. Rust calls that function with its bridge functions; it locks the VM down and returns
// { init, run, settle }. Everything the bridge uses is captured here, before the script can run.
(function (hostCall, hostOutput, hostDone, nativeFreeze) {
  "use strict";
  const G = globalThis;
  const O = Object;
  const defineProperty = O.defineProperty;
  const getOwnPropertyDescriptor = O.getOwnPropertyDescriptor;
  const getPrototypeOf = O.getPrototypeOf;
  const freeze = O.freeze;
  const create = O.create;
  const keysOf = O.keys;
  const ownKeys = Reflect.ownKeys;
  const apply = Reflect.apply;
  const construct = Reflect.construct;
  const stringify = JSON.stringify;
  const parse = JSON.parse;
  const StringFn = String;
  const NumberIsFinite = Number.isFinite;
  const MathFloor = Math.floor;
  const MathImul = Math.imul;
  const ErrorCtor = Error;
  const TypeErrorCtor = TypeError;
  const RangeErrorCtor = RangeError;
  const PromiseCtor = Promise;
  const promiseThen = Promise.prototype.then;
  const ProxyCtor = Proxy;
  const MapCtor = Map;
  const SetCtor = Set;
  const mapGet = Map.prototype.get;
  const mapSet = Map.prototype.set;
  const mapHas = Map.prototype.has;
  const mapDelete = Map.prototype.delete;
  const mapForEach = Map.prototype.forEach;
  const setHas = Set.prototype.has;
  const setAdd = Set.prototype.add;
  const strSplit = String.prototype.split;
  const strIndexOf = String.prototype.indexOf;
  const strToLower = String.prototype.toLowerCase;
  const strReplace = String.prototype.replace;
  const strSlice = String.prototype.slice;
  const strTest = RegExp.prototype.test;
  const strStartsWith = String.prototype.startsWith;
  const arrayJoin = Array.prototype.join;
  const arrayIsArray = Array.isArray;
  const toWellFormed = String.prototype.toWellFormed;
  const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;
  // Output crosses to Rust as UTF-8, which cannot hold a lone surrogate: replace it with U+FFFD.
  function wellFormed(s) {
    return typeof toWellFormed === "function" ? apply(toWellFormed, s, []) : apply(strReplace, s, [LONE_SURROGATE, "\uFFFD"]);
  }
  const RealDate = Date;
  const realDateNow = Date.now;
  const realPerfNow = typeof performance === "object" && performance && typeof performance.now === "function"
    ? performance.now.bind(performance) : () => realDateNow() ;
  const ObjectPrototype = O.prototype;
  const errorStackDesc = null;

  // ---- per-script state, set by init() ----
  let clock = null; // deterministic mode: { now, start }
  let rngState = 0;
  let deterministic = false;
  let finished = false;
  // Call ids are 1, 2, 3, ...: a dense array indexed by id is the cheapest table (QuickJS hashes
  // small numeric Map keys badly).
  const pending = [undefined];
  let pendingCount = 0;
  let limits = { chars: 0, items: 0 };
  let outputChars = 0;
  let outputItems = 0;
  let storeJson = new MapCtor(); // key -> JSON text
  let storeSize = 0;
  // The writes the host applies, in order, all or none: only the last of each key, a key written
  // again moving to the end. Every store() call adding one let a loop of writes to one key grow
  // the list (and the host's copy of it) without bound; this way it is bounded by the store's
  // own limits, and the last write of each key still wins, also where two keys are one to the
  // host (a lone surrogate becomes U+FFFD). key -> json, or undefined for a delete.
  let writes = new MapCtor();
  let deletedSize = 0; // characters of the keys `writes` deletes
  const EXIT = freeze({ codemodeExit: true });

  // ---- deterministic hooks installed before lockdown ----
  // Seeded per script by the host (from the log's seed in deterministic runs): the engine's own
  // generator would restart from the same state in every script, since each starts from the same
  // saved VM image.
  G.Math.random = function random() {
    // mulberry32
    rngState = (rngState + 0x6d2b79f5) | 0;
    let t = rngState;
    t = MathImul(t ^ (t >>> 15), t | 1);
    t ^= t + MathImul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  function currentMs() {
    return clock ? clock.now : realDateNow();
  }
  function DateShim(...args) {
    if (new.target === undefined) return new RealDate(currentMs()).toString();
    if (args.length === 0) return construct(RealDate, [currentMs()], new.target);
    // Deterministic runs are in UTC: read local-time components as UTC ones.
    if (deterministic && args.length >= 2) return construct(RealDate, [apply(RealDate.UTC, RealDate, args)], new.target);
    if (deterministic && args.length === 1 && typeof args[0] === "string") return construct(RealDate, [utcParse(args[0])], new.target);
    return construct(RealDate, args, new.target);
  }
  // A date text without a zone means local time; deterministic runs read it as UTC, so the
  // machine's zone cannot change what a replay computes. With a zone, "Z" makes it invalid.
  function utcParse(text) {
    const asUtc = RealDate.parse(text + "Z");
    return asUtc === asUtc ? asUtc : RealDate.parse(text);
  }
  // Not `RealDate` as its prototype: `Object.getPrototypeOf(Date)` would hand back the real
  // clock, past the virtual one of deterministic runs. Its statics are copied instead.
  defineProperty(DateShim, "UTC", { value: RealDate.UTC, writable: true, configurable: true });
  defineProperty(DateShim, "parse", { value: function parse(text) { return deterministic ? utcParse(String(text)) : RealDate.parse(text); }, writable: true, configurable: true });
  defineProperty(DateShim, "prototype", { value: RealDate.prototype, writable: false, enumerable: false, configurable: false });
  defineProperty(DateShim, "name", { value: "Date", configurable: true });
  defineProperty(DateShim, "length", { value: 7, configurable: true });
  defineProperty(DateShim, "now", { value: function now() { return currentMs(); }, writable: true, configurable: true });
  defineProperty(RealDate.prototype, "constructor", { value: DateShim, writable: true, configurable: true });
  defineProperty(G, "Date", { value: DateShim, writable: true, configurable: true });
  // Deterministic runs use UTC: local-time readers answer with their UTC counterparts.
  const dp = RealDate.prototype;
  const utcPairs = [["getFullYear", "getUTCFullYear"], ["getMonth", "getUTCMonth"], ["getDate", "getUTCDate"], ["getDay", "getUTCDay"],
    ["getHours", "getUTCHours"], ["getMinutes", "getUTCMinutes"], ["getSeconds", "getUTCSeconds"], ["getMilliseconds", "getUTCMilliseconds"]];
  for (let i = 0; i < utcPairs.length; i++) {
    const local = dp[utcPairs[i][0]];
    const utc = dp[utcPairs[i][1]];
    defineProperty(dp, utcPairs[i][0], { value: { [utcPairs[i][0]]() { return apply(deterministic ? utc : local, this, []); } }[utcPairs[i][0]], writable: true, configurable: true });
  }
  const realTzo = dp.getTimezoneOffset;
  defineProperty(dp, "getTimezoneOffset", { value: function getTimezoneOffset() { return deterministic ? 0 : apply(realTzo, this, []); }, writable: true, configurable: true });
  const realToUTCString = dp.toUTCString;
  const realToISOString = dp.toISOString;
  // "Thu Jan 01 1970 00:00:00 GMT+0000 (Coordinated Universal Time)", the local format at UTC.
  function utcText(d, date, time) {
    const u = apply(realToUTCString, d, []); // "Thu, 01 Jan 1970 00:00:00 GMT"
    if (u === "Invalid Date") return u;
    const p = apply(strSplit, u, [" "]);
    const iso = apply(realToISOString, d, []);
    const year = apply(strSlice, iso, [0, apply(strIndexOf, iso, ["-", 1])]);
    const dateText = apply(strSlice, p[0], [0, 3]) + " " + p[2] + " " + p[1] + " " + year;
    const timeText = p[4] + " GMT+0000 (Coordinated Universal Time)";
    return date && time ? dateText + " " + timeText : date ? dateText : timeText;
  }
  const localTexts = [["toString", true, true], ["toDateString", true, false], ["toTimeString", false, true]];
  for (let i = 0; i < localTexts.length; i++) {
    const [name, date, time] = localTexts[i];
    const real = dp[name];
    defineProperty(dp, name, { value: { [name]() {
      return deterministic ? utcText(this, date, time) : apply(real, this, []);
    } }[name], writable: true, configurable: true });
  }

  const perf = create(null);
  defineProperty(perf, "now", { value: function now() { return clock ? clock.now - clock.start : realPerfNow(); }, enumerable: true });
  defineProperty(perf, "timeOrigin", { get() { return clock ? clock.start : realDateNow() - realPerfNow(); }, enumerable: true });
  defineProperty(G, "performance", { value: freeze(perf), writable: true, configurable: true, enumerable: false });

  // ---- atob / btoa (HTML's forgiving base64), pure functions: models reach for them to decode
  // base64 data from MCP tools. Written here rather than taken from the engine, whose versions
  // throw DOMException, which this VM does not have; these throw an Error named
  // "InvalidCharacterError" as browsers' DOMException does.
  const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const b64Value = new Int16Array(128).fill(-1);
  for (let i = 0; i < 64; i++) b64Value[B64.charCodeAt(i)] = i;
  const fromCharCode = String.fromCharCode;
  const strCharCodeAt = String.prototype.charCodeAt;
  const CHUNK = 8192;
  function invalidCharacter(message) {
    const e = new ErrorCtor(message);
    defineProperty(e, "name", { value: "InvalidCharacterError", writable: true, enumerable: false, configurable: true });
    return e;
  }
  function btoa(data) {
    if (arguments.length === 0) throw new TypeErrorCtor("btoa() needs 1 argument");
    const s = StringFn(data);
    const n = s.length;
    const parts = [];
    let out = [];
    for (let i = 0; i < n; i += 3) {
      const a = apply(strCharCodeAt, s, [i]);
      const b = i + 1 < n ? apply(strCharCodeAt, s, [i + 1]) : 0;
      const c = i + 2 < n ? apply(strCharCodeAt, s, [i + 2]) : 0;
      if (a > 255 || b > 255 || c > 255) {
        throw invalidCharacter("btoa() takes a string of characters U+0000 to U+00FF (bytes); encode text to UTF-8 bytes first");
      }
      const t = (a << 16) | (b << 8) | c;
      out.push(B64[t >> 18], B64[(t >> 12) & 63], i + 1 < n ? B64[(t >> 6) & 63] : "=", i + 2 < n ? B64[t & 63] : "=");
      if (out.length >= CHUNK) {
        parts.push(apply(arrayJoin, out, [""]));
        out = [];
      }
    }
    parts.push(apply(arrayJoin, out, [""]));
    return apply(arrayJoin, parts, [""]);
  }
  function isSpace(c) {
    return c === 0x09 || c === 0x0a || c === 0x0c || c === 0x0d || c === 0x20;
  }
  function atob(data) {
    if (arguments.length === 0) throw new TypeErrorCtor("atob() needs 1 argument");
    const s = StringFn(data);
    // First pass: how many characters count, and whether the last one or two are padding.
    let count = 0;
    let last = -1;
    let beforeLast = -1;
    for (let i = 0; i < s.length; i++) {
      const c = apply(strCharCodeAt, s, [i]);
      if (isSpace(c)) continue;
      count++;
      beforeLast = last;
      last = c;
    }
    let len = count;
    if (len % 4 === 0 && len > 0 && last === 0x3d) {
      len--;
      if (beforeLast === 0x3d) len--;
    }
    if (len % 4 === 1) throw invalidCharacter("atob() got a string that is not valid base64 (its length is wrong)");
    const parts = [];
    let out = [];
    let acc = 0;
    let bits = 0;
    let seen = 0;
    for (let i = 0; seen < len; i++) {
      const c = apply(strCharCodeAt, s, [i]);
      if (isSpace(c)) continue;
      seen++;
      const v = c < 128 ? b64Value[c] : -1;
      if (v < 0) throw invalidCharacter("atob() got a string that is not valid base64 (it has the character " + stringify(fromCharCode(c)) + ")");
      acc = (acc << 6) | v;
      bits += 6;
      if (bits >= 8) {
        bits -= 8;
        out.push((acc >> bits) & 255);
        acc &= (1 << bits) - 1;
        if (out.length >= CHUNK) {
          parts.push(apply(fromCharCode, null, out));
          out = [];
        }
      }
    }
    parts.push(apply(fromCharCode, null, out));
    return apply(arrayJoin, parts, [""]);
  }
  defineProperty(G, "atob", { value: atob, writable: true, enumerable: false, configurable: true });
  defineProperty(G, "btoa", { value: btoa, writable: true, enumerable: false, configurable: true });

  // ---- things that must not exist in the VM ----
  const banned = ["WeakRef", "FinalizationRegistry", "Atomics", "navigator", "gc", "os", "std", "scriptArgs", "print"];
  for (let i = 0; i < banned.length; i++) delete G[banned[i]];
  // `Error.prepareStackTrace` is an accessor whose setter writes the context, which freezing
  // does not stop; once set, its CallSite objects' getFunction() hands the script the function
  // of every frame, the prelude's own among them. A plain data property cuts the setter off.
  defineProperty(ErrorCtor, "prepareStackTrace", { value: undefined, writable: false, enumerable: false, configurable: false });
  // `Error.stackTraceLimit` is such an accessor too: an object with `valueOf` set there runs
  // script code whenever an error is made, inside native bridge code as well.
  defineProperty(ErrorCtor, "stackTraceLimit", { value: ErrorCtor.stackTraceLimit, writable: false, enumerable: false, configurable: false });

  // ---- lockdown: freeze every reachable built-in ----
  // Data properties that scripts commonly assign on their own objects ("override mistake") become
  // accessors first, so `this.name = ...` in an Error subclass still works once prototypes freeze.
  function lockdown() {
    const extra = [
      getPrototypeOf(function* () {}),
      getPrototypeOf(async function () {}),
      getPrototypeOf(async function* () {}),
      getPrototypeOf((function* () {})()),
      getPrototypeOf((async function* () {})()),
      getPrototypeOf(getPrototypeOf((function* () {})())),
      getPrototypeOf(getPrototypeOf((async function* () {})())),
      getPrototypeOf([][Symbol.iterator]()),
      getPrototypeOf(getPrototypeOf([][Symbol.iterator]())),
      getPrototypeOf(new MapCtor().entries()),
      getPrototypeOf(new SetCtor().entries()),
      getPrototypeOf(""[Symbol.iterator]()),
      getPrototypeOf(/a/[Symbol.matchAll]("")),
      getPrototypeOf(Int8Array),
      getPrototypeOf(Int8Array).prototype,
      getPrototypeOf(new Int8Array(0)[Symbol.iterator]()),
      getPrototypeOf(Promise.resolve()),
      getPrototypeOf(function () { return arguments; }()),
    ];
    try {
      if (typeof Iterator === "function" && Iterator.prototype.map) extra.push(getPrototypeOf([].values().map((x) => x)));
      if (typeof Iterator === "function" && Iterator.from) extra.push(getPrototypeOf(Iterator.from({ next() { return { done: true }; } })));
    } catch (_) {}
    // Object.prototype members, and the usual override targets on every built-in prototype
    // (`this.name = "MyError"` in an Error subclass, `obj.toString = ...`).
    const targets = [ObjectPrototype];
    for (let i = 0; i < extra.length; i++) targets.push(extra[i]);
    const gk = ownKeys(G);
    for (let i = 0; i < gk.length; i++) {
      const d = getOwnPropertyDescriptor(G, gk[i]);
      if (!d || !("value" in d) || typeof d.value !== "function") continue;
      const pd = getOwnPropertyDescriptor(d.value, "prototype");
      if (pd && "value" in pd && pd.value !== null && typeof pd.value === "object" && pd.value !== ObjectPrototype) targets.push(pd.value);
    }
    const overridable = ["constructor", "name", "message", "toString", "toLocaleString", "valueOf", "toJSON"];
    for (let n = 0; n < targets.length; n++) {
      const o = targets[n];
      const ks = o === ObjectPrototype ? ownKeys(o) : overridable;
      for (let i = 0; i < ks.length; i++) {
        const k = ks[i];
        const d = getOwnPropertyDescriptor(o, k);
        if (!d || !("value" in d) || !d.writable || !d.configurable) continue;
        const value = d.value;
        const home = o;
        defineProperty(o, k, {
          get: function () { return value; },
          set: function (v) {
            if (this === home) throw new TypeErrorCtor("Cannot assign to read only property '" + StringFn(k) + "' of a built-in");
            defineProperty(this, k, { value: v, writable: true, enumerable: true, configurable: true });
          },
          enumerable: d.enumerable,
          configurable: false,
        });
      }
    }
    const roots = [G];
    for (let i = 0; i < extra.length; i++) roots.push(extra[i]);
    nativeFreeze(roots);
    for (let i = 0; i < gk.length; i++) {
      const d = getOwnPropertyDescriptor(G, gk[i]);
      if (d && d.configurable && "value" in d) defineProperty(G, gk[i], { writable: false, configurable: false });
    }
  }
  lockdown();

  // ---- helpers ----
  // Functions made here are frozen with the `prototype` object a plain function carries.
  function sealed(value) {
    if (typeof value === "function") {
      const d = getOwnPropertyDescriptor(value, "prototype");
      if (d && d.value !== null && typeof d.value === "object") freeze(d.value);
    }
    return freeze(value);
  }
  function setGlobal(name, value) {
    defineProperty(G, name, { value: sealed(value), writable: false, enumerable: true, configurable: false });
  }
  function comparable(s) {
    return apply(strReplace, apply(strToLower, s, []), [/[^a-z0-9]/g, ""]);
  }
  function missingText(label, prop, names, hint) {
    const want = comparable(prop);
    let exact = [];
    let close = [];
    for (let i = 0; i < names.length; i++) {
      const c = comparable(names[i]);
      if (c === want) exact.push(label + "." + names[i]);
      else if (want.length > 0 && c.length > 0 && (apply(strIndexOf, c, [want]) >= 0 || apply(strIndexOf, want, [c]) >= 0)) close.push(label + "." + names[i]);
    }
    const matches = exact.length > 0 ? exact : close;
    let msg = label + "." + prop + " is not a known name.";
    if (matches.length > 0) {
      const top = [];
      for (let i = 0; i < matches.length && i < 5; i++) top.push(matches[i]);
      msg += " Closest: " + apply(arrayJoin, top, [", "]) + ".";
    } else if (names.length <= 20) {
      msg += " Known names: " + apply(arrayJoin, names, [", "]) + ".";
    }
    if (hint) msg += hint;
    return msg;
  }
  // `tools.x` is an own property of a frozen object and is read without a trap (a proxy's get
  // trap cost every call more than the call's own JSON). Only a name that is not there reaches
  // the proxy behind it, as its prototype, which explains the miss.
  function guard(target, label, names, hint) {
    const miss = new ProxyCtor(freeze(create(null)), {
      get(t, p) {
        if (typeof p !== "string" || p in ObjectPrototype || p === "then" || p === "toJSON") return undefined;
        throw new TypeErrorCtor(missingText(label, p, names, hint));
      },
    });
    const front = create(miss);
    const ks = ownKeys(target);
    for (let i = 0; i < ks.length; i++) defineProperty(front, ks[i], getOwnPropertyDescriptor(target, ks[i]));
    return freeze(front);
  }

  function callHost(kind, name, value) {
    let id;
    try {
      // Plain data becomes JSON natively; for anything else (getters, toJSON, cycles, large
      // values) the host answers null, and JSON.stringify makes the text here.
      id = hostCall(kind, name, value, null);
    } catch (e) {
      return PromiseCtor.reject(e);
    }
    if (id === null) {
      let json;
      try {
        json = stringify(value === undefined ? null : value);
        if (json === undefined) json = "null";
      } catch (e) {
        return PromiseCtor.reject(new TypeErrorCtor(e && e.message !== undefined ? e.message : StringFn(e)));
      }
      try {
        id = hostCall(kind, name, undefined, json);
      } catch (e) {
        return PromiseCtor.reject(e);
      }
    }
    // The host answered at once: a promise fulfilled with the result.
    if (typeof id !== "number") return id;
    return new PromiseCtor(function (resolve, reject) {
      pending[id] = { resolve, reject };
      pendingCount++;
    });
  }

  function settle(id, ok, payload, name, props, now) {
    if (clock && typeof now === "number" && now > clock.now) clock.now = now;
    const p = pending[id];
    if (!p) return;
    pending[id] = undefined;
    pendingCount--;
    if (ok) {
      p.resolve(payload);
      return;
    }
    const e = new ErrorCtor(payload);
    if (typeof name === "string" && name !== "" && name !== "Error") {
      defineProperty(e, "name", { value: name, writable: true, enumerable: false, configurable: true });
    }
    if (typeof props === "string") {
      const extra = parse(props);
      const ks = keysOf(extra);
      for (let i = 0; i < ks.length; i++) {
        const k = ks[i];
        if (k === "name" || k === "message" || k === "stack") continue;
        defineProperty(e, k, { value: extra[k], writable: true, enumerable: true, configurable: true });
      }
    }
    p.reject(e);
  }

  // ---- error and value formatting ----
  function isErrorLike(v) {
    return v !== null && typeof v === "object" && v instanceof ErrorCtor;
  }
  function errorText(e) {
    let name;
    let message;
    try { name = StringFn(e.name); } catch (_) { name = "Error"; }
    try { message = StringFn(e.message); } catch (_) { message = ""; }
    let head = message === "" ? name : name + ": " + message;
    let stack = "";
    try { stack = typeof e.stack === "string" ? e.stack : ""; } catch (_) {}
    const lines = apply(strSplit, stack, ["\n"]);
    for (let i = 0; i < lines.length; i++) {
      const l = lines[i];
      if (l === "" || apply(strIndexOf, l, ["codemode-prelude.js"]) >= 0) continue;
      if (!apply(strStartsWith, l, ["    at "])) continue;
      head += "\n" + l;
    }
    return head;
  }
  function format(v) {
    if (typeof v === "string") return v;
    if (isErrorLike(v)) return errorText(v);
    if (typeof v === "number") return StringFn(v);
    try {
      const j = stringify(v);
      if (j !== undefined) return j;
    } catch (_) {}
    return StringFn(v);
  }
  function describeError(e) {
    if (isErrorLike(e)) {
      let name = "Error";
      let message = "";
      try { name = StringFn(e.name); } catch (_) {}
      try { message = StringFn(e.message); } catch (_) {}
      return stringify({ name, message, stack: errorText(e) });
    }
    let message;
    try { message = format(e); } catch (_) { message = "unprintable thrown value"; }
    return stringify({ message, nonError: true, isNull: e === null });
  }

  function finishOk(value) {
    if (finished) return;
    let json;
    try {
      json = value === undefined ? undefined : stringify(value);
    } catch (e) {
      finishErr(e);
      return;
    }
    // The returned value is output too: it counts against the same limit as text().
    const len = typeof value === "string" ? value.length : json === undefined ? 0 : json.length;
    if (len > limits.chars - outputChars) {
      finishErr(new RangeErrorCtor("the returned value is " + len + " characters, and with the " + outputChars +
        " characters already output that passes the output limit of " + limits.chars +
        " characters. Return a summary instead, or write large data to a file with a tool."));
      return;
    }
    // A string travels to the host as JSON, where a control character takes six: 16 million
    // of them made 96 MB, past what the worker may hold beside its heap.
    if (typeof value === "string" && json.length > 2 * limits.chars) {
      finishErr(new RangeErrorCtor("the returned string is " + len + " characters but " + json.length +
        " once written as JSON (control characters take six each), more than twice the output limit of " +
        limits.chars + " characters. Print it with text() instead, or return less."));
      return;
    }
    finished = true;
    hostDone(true, json, stringify(writeList()));
  }
  function finishErr(e) {
    if (finished) return;
    finished = true;
    let desc;
    try {
      desc = describeError(e);
    } catch (_) {
      desc = undefined;
    }
    hostDone(false, desc, undefined);
  }

  // ---- output ----
  const OUTPUT_LIMIT_TEXT = () =>
    "script output exceeded the limit of " + limits.chars + " characters or " + limits.items +
    " text(), image(), and console calls. Print a summary instead, or write large data to a file with a tool.";
  function account(len) {
    outputChars += len;
    outputItems += 1;
    if (len > limits.chars || outputChars > limits.chars || outputItems > limits.items) {
      const err = new RangeErrorCtor(OUTPUT_LIMIT_TEXT());
      finishErr(err);
      throw err;
    }
  }
  function text(value) {
    if (finished) return;
    let s;
    if (typeof value === "string") s = value;
    else if (value === null || value === undefined || typeof value === "number" || typeof value === "boolean" ||
      typeof value === "symbol" || typeof value === "bigint") s = StringFn(value);
    else {
      try {
        s = stringify(value);
      } catch (e) {
        throw new TypeErrorCtor(e && e.message !== undefined ? e.message : StringFn(e));
      }
      if (s === undefined) s = StringFn(value);
    }
    account(s.length);
    hostOutput(0, wellFormed(s), undefined);
  }
  function consoleLine() {
    if (finished) return;
    const parts = [];
    for (let i = 0; i < arguments.length; i++) parts.push(format(arguments[i]));
    const s = apply(arrayJoin, parts, [" "]);
    account(s.length);
    hostOutput(1, wellFormed(s), undefined);
  }
  const consoleObj = create(ObjectPrototype);
  const levels = ["log", "info", "warn", "error", "debug"];
  for (let i = 0; i < levels.length; i++) {
    defineProperty(consoleObj, levels[i], { value: freeze({ [levels[i]]() { return apply(consoleLine, undefined, arguments); } }[levels[i]]), enumerable: true });
  }
  freeze(consoleObj);

  const IMAGE_SHAPE = 'image() takes a base64 data URL, { image_url: dataUrl }, or an image block { type: "image", data, mimeType }';
  function image(input) {
    if (finished) return;
    let url;
    if (typeof input === "string") url = input;
    else if (input !== null && typeof input === "object") {
      if (typeof input.image_url === "string") url = input.image_url;
      else if (input.type !== undefined) {
        if (input.type !== "image") throw new TypeErrorCtor('image() takes blocks of type "image", not "' + StringFn(input.type) + '"');
        if (typeof input.data !== "string" || input.data === "") throw new TypeErrorCtor("image() got an image block without data");
        url = apply(strStartsWith, input.data, ["data:"]) ? input.data : "data:;base64," + input.data;
      }
    }
    if (typeof url !== "string" || url === "") throw new TypeErrorCtor(IMAGE_SHAPE);
    if (apply(strTest, /^https?:/i, [url])) throw new TypeErrorCtor("image() does not fetch remote URLs; pass the picture as a base64 data URL or an image block");
    const comma = apply(strIndexOf, url, [","]);
    const header = comma < 0 ? "" : apply(strSlice, url, [0, comma]);
    if (!apply(strTest, /^data:/i, [header]) || !apply(strTest, /;base64(;|$)/i, [header])) {
      throw new TypeErrorCtor("image() got a string that is not a base64 data URL (data:<type>;base64,<data>)");
    }
    const data = apply(strReplace, apply(strSlice, url, [comma + 1]), [/\s+/g, ""]);
    if (data.length % 4 !== 0 || !apply(strTest, /^[A-Za-z0-9+/]+={0,2}$/, [data])) {
      throw new TypeErrorCtor("image() data is not valid base64; it may be cut short or damaged");
    }
    const head = apply(strSlice, data, [0, 16]);
    let mime;
    if (apply(strTest, /^iVBORw0KGg/, [head])) mime = "image/png";
    else if (apply(strTest, /^\/9j\/(?!9)/, [head])) mime = "image/jpeg";
    else if (apply(strTest, /^R0lGOD[dl]h/, [head])) mime = "image/gif";
    else if (apply(strTest, /^UklG.{8}RUJQ/, [head])) mime = "image/webp";
    else throw new TypeErrorCtor("image() data is not a PNG, JPEG, GIF or WebP picture");
    account(data.length);
    hostOutput(2, data, mime);
  }

  // textOf(result): the text of an MCP result's text blocks, joined, the line every MCP script
  // writes. Takes the result, its content array, or a string (returned as it is).
  function textOf(result) {
    if (typeof result === "string") return result;
    const blocks = arrayIsArray(result) ? result : result !== null && typeof result === "object" ? result.content : undefined;
    if (!arrayIsArray(blocks)) {
      throw new TypeErrorCtor("textOf() takes a tool result with a `content` array of blocks, such an array, or a string");
    }
    let out = "";
    for (let i = 0; i < blocks.length; i++) {
      const b = blocks[i];
      if (b !== null && typeof b === "object" && b.type === "text" && typeof b.text === "string") out += b.text;
    }
    return out;
  }

  function exit() {
    finishOk(undefined);
    throw EXIT;
  }

  // ---- store ----
  const STORE_VALUE_LIMIT = 262144;
  const STORE_TOTAL_LIMIT = 1048576;
  // The host's limit on a key (MAX_STORE_KEY_BYTES of codemode-state), checked here for deletes
  // as for sets: a delete of a 30-million-character key was kept whole, once per call.
  const STORE_KEY_BYTES = 1024;
  const STORE_HINT = " Keep store() for small state such as ids and short summaries; keep big data in variables, show pictures with image(), or save large data with a tool.";
  // Bytes of `s` in UTF-8 as the host keeps it (a lone surrogate becomes U+FFFD, 3 bytes),
  // counted only until they pass `limit`: a key may be megabytes long.
  function utf8Bytes(s, limit) {
    let n = 0;
    for (let i = 0; i < s.length && n <= limit; i++) {
      const c = apply(strCharCodeAt, s, [i]);
      if (c < 0x80) n += 1;
      else if (c < 0x800) n += 2;
      else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && (apply(strCharCodeAt, s, [i + 1]) & 0xfc00) === 0xdc00) {
        n += 4;
        i++;
      } else n += 3;
    }
    return n;
  }
  function checkKey(key) {
    if (typeof key !== "string") throw new TypeErrorCtor("store() needs a string key");
    // At least a byte a character: a long key is refused without counting it.
    if (key.length > STORE_KEY_BYTES || utf8Bytes(key, STORE_KEY_BYTES) > STORE_KEY_BYTES) {
      throw new RangeErrorCtor('store("' + wellFormed(apply(strSlice, key, [0, 40])) + '…"): the key is more than ' + STORE_KEY_BYTES +
        " bytes long (UTF-8); a key may be at most " + STORE_KEY_BYTES + " bytes. Use a short key such as an id or a name, and keep long text in the value.");
    }
  }
  function record(key, json) {
    if (apply(mapHas, writes, [key])) {
      if (apply(mapGet, writes, [key]) === undefined) deletedSize -= key.length;
      apply(mapDelete, writes, [key]);
    }
    if (json === undefined) deletedSize += key.length;
    apply(mapSet, writes, [key, json]);
  }
  function writeList() {
    const out = [];
    apply(mapForEach, writes, [function (json, key) { out.push(json === undefined ? [key] : [key, json]); }]);
    return out;
  }
  function store(key, value) {
    checkKey(key);
    if (value === undefined) {
      // Deletes of keys the store does not hold are kept too (a script of the same session
      // running meanwhile may have set them), so they have a bound of their own: the store's.
      const pending = apply(mapHas, writes, [key]) && apply(mapGet, writes, [key]) === undefined;
      if (!pending && deletedSize + key.length > STORE_TOTAL_LIMIT) {
        throw new RangeErrorCtor('store("' + key + '", undefined): the keys this script deleted come to more than ' + STORE_TOTAL_LIMIT +
          " characters together, the size of the whole store. Delete only keys that hold a value (load(key) !== undefined).");
      }
      if (apply(mapHas, storeJson, [key])) {
        storeSize -= key.length + apply(mapGet, storeJson, [key]).length;
        apply(mapDelete, storeJson, [key]);
      }
      record(key, undefined);
      return;
    }
    let json;
    try {
      json = stringify(value);
    } catch (e) {
       throw new TypeErrorCtor('store("' + key + '"): the value cannot be turned into JSON: ' + (e && e.message !== undefined ? e.message : StringFn(e)));
    }
    if (json === undefined) throw new TypeErrorCtor('store("' + key + '"): the value cannot be turned into JSON');
    if (json.length > STORE_VALUE_LIMIT) {
      throw new RangeErrorCtor('store("' + key + '"): the value is ' + json.length + " characters of JSON; one value may be at most " + STORE_VALUE_LIMIT + "." + STORE_HINT);
    }
    const old = apply(mapHas, storeJson, [key]) ? key.length + apply(mapGet, storeJson, [key]).length : 0;
    const next = storeSize - old + key.length + json.length;
    if (next > STORE_TOTAL_LIMIT) {
      throw new RangeErrorCtor("store() is full: all values together may be at most " + STORE_TOTAL_LIMIT + " characters of JSON; remove keys with store(key, undefined)." + STORE_HINT);
    }
    storeSize = next;
    apply(mapSet, storeJson, [key, json]);
    record(key, json);
  }
  function load(key) {
    if (typeof key !== "string") throw new TypeErrorCtor("load() needs a string key");
    if (!apply(mapHas, storeJson, [key])) return undefined;
    return parse(apply(mapGet, storeJson, [key]));
  }

  const arraySlice = Array.prototype.slice;
  function makeCaller(kind, name) {
    return sealed(function () {
      return callHost(kind, name, kind === 0 ? arguments[0] : apply(arraySlice, arguments, []));
    });
  }

  // init(config): config = { tools: [[raw, id, description]], globals: [name], store: {k: json},
  //   limits: {chars, items}, det: null | {seed, start} }
  function init(configJson) {
    const cfg = parse(configJson);
    limits = cfg.limits;
    rngState = cfg.rng | 0;
    if (cfg.det) {
      deterministic = true;
      rngState = (cfg.det.seed ^ 0x9e3779b9) | 0;
      clock = { now: cfg.det.start, start: cfg.det.start };
    }
    const sk = keysOf(cfg.store);
    for (let i = 0; i < sk.length; i++) {
      const json = cfg.store[sk[i]];
      apply(mapSet, storeJson, [sk[i], json]);
      storeSize += sk[i].length + json.length;
    }
    const toolsTarget = create(null);
    const toolNames = [];
    const all = [];
    for (let i = 0; i < cfg.tools.length; i++) {
      const [raw, id, description] = cfg.tools[i];
      const fn = makeCaller(0, raw);
      if (!(id in toolsTarget)) {
        defineProperty(toolsTarget, id, { value: fn, enumerable: true });
        toolNames.push(id);
        all.push(freeze({ name: id, description }));
      }
      if (!(raw in toolsTarget)) defineProperty(toolsTarget, raw, { value: fn, enumerable: true });
    }
    freeze(toolsTarget);
    const tools = guard(toolsTarget, "tools", toolNames, " Every tool is in ALL_TOOLS; await searchTools(\"topic\") finds tools by what they do.");
    setGlobal("store", store);
    setGlobal("load", load);
    setGlobal("tools", tools);
    setGlobal("ALL_TOOLS", freeze(all));
    setGlobal("console", consoleObj);
    setGlobal("text", text);
    setGlobal("image", image);
    setGlobal("textOf", textOf);
    setGlobal("exit", exit);
    const namespaces = new MapCtor();
    for (let i = 0; i < cfg.globals.length; i++) {
      const full = cfg.globals[i];
      const dot = apply(strIndexOf, full, ["."]);
      const fn = makeCaller(1, full);
      if (dot < 0) {
        setGlobal(full, fn);
      } else {
        const ns = apply(strSlice, full, [0, dot]);
        const member = apply(strSlice, full, [dot + 1]);
        let entry = apply(mapGet, namespaces, [ns]);
        if (!entry) {
          entry = { target: create(null), names: [] };
          apply(mapSet, namespaces, [ns, entry]);
        }
        defineProperty(entry.target, member, { value: fn, enumerable: true });
        entry.names.push(member);
      }
    }
    namespaces.forEach(function (entry, ns) {
      setGlobal(ns, guard(freeze(entry.target), ns, entry.names, ""));
    });
    return { tools, console: consoleObj };
  }

  function run(fn, toolsObj, consoleArg) {
    let p;
    try {
      p = fn(toolsObj, consoleArg);
    } catch (e) {
      if (e !== EXIT) finishErr(e);
      return;
    }
    apply(promiseThen, p, [finishOk, function (e) { if (e !== EXIT) finishErr(e); }]);
  }

  return { init, run, settle, finishErr };
})
