// The decoder's errors, one class per Python class of the same name (sakura_core/kv/shard_errors.py, chain.py,
// binding.py, manifest_errors.py, manifest_limits.py, limits.py, fetch/errors.py): a caller can fall back on any
// of them and the conformance suite compares the class names with Python's.

function define(name, parent) {
  const cls = class extends parent {};
  Object.defineProperty(cls, "name", { value: name });
  Object.defineProperty(cls.prototype, "name", { value: name });
  return cls;
}

export const ShardFormatError = define("ShardFormatError", Error);
export const ShardMagicError = define("ShardMagicError", ShardFormatError);
export const ShardVersionError = define("ShardVersionError", ShardFormatError);
export const ShardTruncatedError = define("ShardTruncatedError", ShardFormatError);
export const ShardCorruptError = define("ShardCorruptError", ShardFormatError);
export const ShardOversizedError = define("ShardOversizedError", ShardFormatError);
export const ShardChainError = define("ShardChainError", ShardFormatError);
export const UnknownCodecError = define("UnknownCodecError", ShardFormatError);
export const MissingReferenceError = define("MissingReferenceError", ShardChainError);
export const ShardBindingError = define("ShardBindingError", ShardCorruptError);

export const LimitError = define("LimitError", Error);
export const ManifestError = define("ManifestError", Error);
export const ModelMismatchError = define("ModelMismatchError", ManifestError);
// Python's ManifestLimitError is both a ManifestError and a LimitError; JS has one parent: ManifestError, and
// isLimitError() answers for the other.
export const ManifestLimitError = define("ManifestLimitError", ManifestError);

export const FetchError = define("FetchError", Error);
export const ShardIntegrityError = define("ShardIntegrityError", FetchError);

/** True for a LimitError or a ManifestLimitError (Python: isinstance(e, LimitError)). */
export function isLimitError(e) {
  return e instanceof LimitError || e instanceof ManifestLimitError;
}

// Python's bounded_json raises a plain ValueError for bytes that are not JSON (not UTF-8, a syntax error, NaN)
export const JSONValueError = define("JSONValueError", Error);

// the shard client's (sakura_core/fetch/errors.py)
export const ShardUnavailableError = define("ShardUnavailableError", FetchError);
export const ShardNotFoundError = define("ShardNotFoundError", ShardUnavailableError);
export const AuthError = define("AuthError", FetchError);
export const RedirectRefusedError = define("RedirectRefusedError", FetchError);
