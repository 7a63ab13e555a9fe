// Throughput estimation from completed transfers (RobustMPC-style), as sakura_core/policy/estimator.py: the harmonic
// mean of the last `window` samples, RobustMPC's error-discounted estimate and the worst of both. Rates in bytes/s.

/** window: samples in the harmonic mean; minSampleBytes: smaller transfers are pooled until they reach it;
 *  priorBytesPerS: the estimate before any sample (0.5 Mbit/s); seedRttShare: the most of a pre-lane transfer's time
 *  seed() takes for its round trip. */
export class EstimatorConfig {
  constructor({ window = 5, minSampleBytes = 16 * 1024, priorBytesPerS = 0.5e6 / 8, seedRttShare = 0.5 } = {}) {
    if (!(window >= 1)) throw new RangeError(`window must be >= 1, got ${window}`);
    if (!(priorBytesPerS > 0)) throw new RangeError(`priorBytesPerS must be > 0, got ${priorBytesPerS}`);
    if (!(seedRttShare >= 0 && seedRttShare < 1)) throw new RangeError(`seedRttShare must be in [0, 1), got ${seedRttShare}`);
    this.window = window;
    this.minSampleBytes = minSampleBytes;
    this.priorBytesPerS = priorBytesPerS;
    this.seedRttShare = seedRttShare;
    Object.freeze(this);
  }
}

export class ThroughputEstimator {
  constructor(config = new EstimatorConfig()) {
    this.config = config;
    this.reset();
  }

  reset() {
    this._samples = [];
    this._errors = [];
    this._lastPrediction = null;
    this._pooled = [0.0, 0.0]; // small transfers not yet a sample: bytes, seconds
  }

  /** An estimator in the state Python's is in (`samples`, `errors`, `last_prediction`, `pooled`). */
  static fromState(config, { samples, errors, last_prediction: last, pooled }) {
    const e = new ThroughputEstimator(config);
    e._samples = samples.slice(-config.window);
    e._errors = errors.slice(-config.window);
    e._lastPrediction = last;
    e._pooled = [pooled[0], pooled[1]];
    return e;
  }

  get samples() {
    return this._samples.length;
  }

  observe(nbytes, seconds) {
    if (nbytes <= 0 || seconds <= 0) return;
    if (nbytes < this.config.minSampleBytes) {
      nbytes = this._pooled[0] + nbytes;
      seconds = this._pooled[1] + seconds;
      if (nbytes < this.config.minSampleBytes) {
        this._pooled = [nbytes, seconds];
        return;
      }
    }
    this._take(nbytes, seconds);
  }

  /** nbytes over seconds as a sample (what was pooled is in it or given up). */
  _take(nbytes, seconds) {
    this._pooled = [0.0, 0.0];
    const rate = nbytes / seconds;
    if (this._lastPrediction !== null) _push(this._errors, Math.abs(this._lastPrediction - rate) / rate, this.config.window);
    _push(this._samples, rate, this.config.window);
    this._lastPrediction = this.harmonic();
  }

  /** A transfer made before the lanes (the manifest, the template image) as a sample, its round trip taken off but
   *  at most seedRttShare of its time (estimator.py's seed: a transfer of a round trip or two is latency more than
   *  bytes); a sample of its own whatever its size, with what small transfers were pooled before it. */
  seed(nbytes, seconds, rttS) {
    if (nbytes <= 0 || seconds <= 0) return;
    const rtt = Math.min(Math.max(rttS, 0.0), this.config.seedRttShare * seconds);
    this._take(this._pooled[0] + nbytes, this._pooled[1] + seconds - rtt);
  }

  /** Harmonic mean of the recent samples (the prior before any). */
  harmonic() {
    if (this._samples.length === 0) return this.config.priorBytesPerS;
    let sum = 0; // Python 3.11's sum(): left to right, uncompensated
    for (const s of this._samples) sum += 1.0 / s;
    return this._samples.length / sum;
  }

  /** Harmonic mean / (1 + max recent relative prediction error). */
  robust() {
    const err = this._errors.length ? this._errors.reduce((a, b) => (b > a ? b : a)) : 0.0;
    return this.harmonic() / (1.0 + err);
  }

  /** The lower of robust() and the slowest recent sample: for irreversible decisions. */
  worst() {
    if (this._samples.length === 0) return this.config.priorBytesPerS;
    const slowest = this._samples.reduce((a, b) => (b < a ? b : a));
    const r = this.robust();
    return slowest < r ? slowest : r;
  }
}

function _push(deque, x, maxlen) {
  deque.push(x);
  if (deque.length > maxlen) deque.shift();
}
