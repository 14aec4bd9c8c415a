// Typed arrays <-> base64, so tests can move large arrays through page.evaluate quickly.
const TYPES = { f32: Float32Array, i32: Int32Array, u32: Uint32Array };

// The platform's own codec where it has one (Uint8Array.prototype.toBase64 and
// Uint8Array.fromBase64: Chrome 140, Firefox 133, Safari 18.2); else through a binary string.
const NATIVE = typeof Uint8Array.fromBase64 === 'function'
  && typeof Uint8Array.prototype.toBase64 === 'function';

function bytesToB64(bytes) {
  if (NATIVE) return bytes.toBase64();
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

export function encode(arr) {
  const dtype = arr instanceof Float32Array ? 'f32' : arr instanceof Int32Array ? 'i32' : 'u32';
  return { __b64__: bytesToB64(new Uint8Array(arr.buffer, arr.byteOffset, arr.byteLength)), dtype };
}

function b64ToBytes(text) {
  if (NATIVE) return Uint8Array.fromBase64(text);
  const bin = atob(text);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return bytes;
}

export function decode(obj) {
  return new TYPES[obj.dtype](b64ToBytes(obj.__b64__).buffer);
}

/** Decode every {__b64__} inside plain objects and arrays. */
export function decodeAll(x) {
  if (x && typeof x === 'object') {
    if ('__b64__' in x) return decode(x);
    if (Array.isArray(x)) return x.map(decodeAll);
    return Object.fromEntries(Object.entries(x).map(([k, v]) => [k, decodeAll(v)]));
  }
  return x;
}

/** Encode every typed array inside plain objects and arrays. */
export function encodeAll(x) {
  if (ArrayBuffer.isView(x)) return encode(x);
  if (Array.isArray(x)) return x.map(encodeAll);
  if (x && typeof x === 'object') {
    return Object.fromEntries(Object.entries(x).map(([k, v]) => [k, encodeAll(v)]));
  }
  return x;
}
