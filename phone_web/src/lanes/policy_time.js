// The CPU the page's policy takes: its decisions run on the page's thread, beside the streaming fetch and the
// messages of the decode and compute workers, so on a phone's few cores they are work the edit pays for. A policy
// wrapped by timedPolicy counts the wall seconds of every call of the lanes' asks (the Python runtime's "ms per
// decision" for the page).

const ASKS = new Set(["choose", "worthAsking", "upgrade", "keepTemplate", "recomputeLate"]);

/** `policy` with each lane ask timed into `spent` ({s, calls}, added to in place); every other member as it is. */
export function timedPolicy(policy, spent) {
  const clock = globalThis.performance ?? Date;
  return new Proxy(policy, {
    get(target, key, receiver) {
      const member = Reflect.get(target, key, receiver);
      if (typeof member !== "function" || !ASKS.has(key)) return member;
      return (...args) => {
        const t0 = clock.now();
        try {
          return member.apply(target, args);
        } finally {
          spent.s += (clock.now() - t0) / 1000;
          spent.calls += 1;
        }
      };
    },
  });
}
