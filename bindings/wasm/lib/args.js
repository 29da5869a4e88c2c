'use strict';
// JavaScript values to what the wasm side takes, each failure an InvalidInputError naming the
// option the caller wrote. What a value may be (ids, urls, limits) is core's decision; this only
// refuses what cannot be converted faithfully: a non-string where a string goes, a lone
// surrogate (TextEncoder would replace it with U+FFFD, so two ids would share one key), a
// non-finite number (JSON would turn it into null, i.e. "not given").

const wasm = require('../pkg/leaselock_wasm.js');
const { fromWasm, invalid } = require('./errors');

/** Calls into wasm; an error it throws becomes its `Error` subclass. */
function call(fn) {
  try {
    return fn();
  } catch (thrown) {
    throw fromWasm(thrown);
  }
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** A value as an error message shows it: strings quoted, escaped and bounded by core. */
function shown(value) {
  if (typeof value === 'string') {
    if (!LONE_SURROGATE.test(value)) {
      return wasm.renderValue(value);
    }
    // Shown with each lone surrogate as `\u{d800}`: a &str would have replaced it with U+FFFD.
    const units = new Uint16Array(Math.min(value.length, 200));
    for (let i = 0; i < units.length; i++) {
      units[i] = value.charCodeAt(i);
    }
    return wasm.renderUtf16(units, Buffer.byteLength(value));
  }
  if (typeof value === 'number' || typeof value === 'boolean' || value === null || value === undefined) {
    return String(value);
  }
  return `a value of type ${Array.isArray(value) ? 'array' : typeof value}`;
}

function typeName(value) {
  return value === null ? 'null' : Array.isArray(value) ? 'array' : typeof value;
}

/** A string of well-formed UTF-16. */
function text(field, value) {
  if (typeof value !== 'string') {
    throw invalid(field, `must be a string, got ${typeName(value)}`);
  }
  if (LONE_SURROGATE.test(value)) {
    throw invalid(field, `${shown(value)} holds a lone surrogate: not valid Unicode`);
  }
  return value;
}

/** A whole number >= 0 (a number, not a string or a boolean). */
function count(field, value) {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0) {
    throw invalid(field, `must be a whole number >= 0, got ${shown(value)}`);
  }
  return value;
}

/** Throws for what JSON would change or drop in an options object: non-finite numbers, lone
 * surrogates, functions, symbols, BigInts. `field` names the option (the top-level key of an
 * options object). */
function checkJson(field, value, depth = 0) {
  switch (typeof value) {
    case 'string':
      text(field, value);
      return;
    case 'number':
      if (!Number.isFinite(value)) {
        throw invalid(field, `${shown(value)} is not a finite number`);
      }
      return;
    case 'function':
    case 'symbol':
    case 'bigint':
      throw invalid(field, `must not be a ${typeof value}`);
    case 'object':
      if (value === null) {
        return;
      }
      if (depth > 8) {
        throw invalid(field, 'is nested too deeply');
      }
      for (const [k, v] of Object.entries(value)) {
        if (LONE_SURROGATE.test(k)) {
          throw invalid(field, `${shown(k)} holds a lone surrogate: not valid Unicode`);
        }
        // An options object's keys are the options; deeper, the option itself is named.
        const named = depth === 0 && field === 'options' && /^[A-Za-z][A-Za-z0-9]{0,63}$/.test(k) ? k : field;
        checkJson(named, v, depth + 1);
      }
      return;
    default:
  }
}

/** `value` as JSON text for the wasm side, checked first (see `checkJson`). */
function json(field, value) {
  checkJson(field, value);
  try {
    return JSON.stringify(value);
  } catch (e) {
    throw invalid(field, e.message);
  }
}

module.exports = { call, count, json, shown, text };
