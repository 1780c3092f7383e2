/* Walk the records of a v2 batch, as broker_core/codec/records.py's _walk does, in C.
 *
 * record_walk_object(obj, pos, count, keyed) walks the records in obj[pos:] (obj: any
 * contiguous buffer: bytes, bytearray, memoryview) and returns 0 when each one parses (its
 * length frames it exactly, its fields fit, offset deltas run 0..n-1, the count matches
 * and, with keyed, each record has a key), or an error code (enum below); then
 * record_walk_failure(out) gives the failing record's index (out[0]) and the position
 * where it starts (out[1]; for the count check: where the walk ended), kept per thread.
 * Python re-walks that one record to word the error, so the messages live in Python.
 * Loaded with ctypes.PyDLL (the GIL held): the buffer is taken with CPython's buffer API,
 * declared here (stable ABI since 3.11) so that no Python headers are needed; the
 * interpreter that loads the library provides the symbols.
 *
 * Hostile input: every read is bounds-checked against end; the timestamp delta (a 64-bit
 * varint, as Kafka reads it) stops at 10 bytes, and its value, when it does not fit 64
 * bits, saturates to INT64_MIN / INT64_MAX (only the walk's position depends on it); every
 * other varint is a 32-bit one, as Kafka reads it: at most 5 bytes, its value within 32
 * bits (varints.read_varint32); lengths are compared with the bytes left, never added
 * blindly.
 */
#include <stddef.h>
#include <stdint.h>

enum {
    WALK_OK = 0,
    WALK_PAST_END = 1,      /* a read runs past the end of the buffer */
    WALK_VARINT = 2,        /* a varint runs over 10 bytes (32-bit ones: 5, or 32 bits) */
    WALK_LENGTH = 3,        /* a record length under 6 or past the end */
    WALK_DELTA = 4,         /* an offset delta other than the record's index */
    WALK_NO_KEY = 5,        /* keyed, and a record without a key */
    WALK_FIELD = 6,         /* a negative field length (other than -1 where nullable) */
    WALK_HEADERS = 7,       /* a negative header count */
    WALK_FRAME = 8,         /* a record's fields do not end where its length says */
    WALK_COUNT = 9,         /* the record count differs from the header's */
};

/* The ABI this file implements; the Python loader refuses a library with another one. */
int record_walk_abi(void) { return 2; }

/* The zigzag varint at *pos into *value; *pos moves past it. */
static int varint_long(const uint8_t *buf, int64_t end, int64_t *pos, int64_t *value);

/* The usual one- or two-byte varint at *pos (deltas, lengths under 8 KiB): 1 with *value
 * set and *pos moved past it, or 0 when it is longer (or the buffer ends first). */
static inline int varint_short(const uint8_t *buf, int64_t end, int64_t *pos, int64_t *value)
{
    int64_t at = *pos;
    if (end - at < 2)
        return 0;
    uint64_t raw = buf[at];
    if (raw < 0x80) {
        *pos = at + 1;
    } else if (buf[at + 1] < 0x80) {
        raw = (raw & 0x7F) | ((uint64_t)buf[at + 1] << 7);
        *pos = at + 2;
    } else {
        return 0;
    }
    *value = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    return 1;
}

static inline int varint(const uint8_t *buf, int64_t end, int64_t *pos, int64_t *value)
{
    return varint_short(buf, end, pos, value) ? WALK_OK : varint_long(buf, end, pos, value);
}

/* The 32-bit zigzag varint at *pos into *value (at most 5 bytes, its value within 32
 * bits); *pos moves past it. */
static int varint32_long(const uint8_t *buf, int64_t end, int64_t *pos, int64_t *value);

static inline int varint32(const uint8_t *buf, int64_t end, int64_t *pos, int64_t *value)
{
    return varint_short(buf, end, pos, value) ? WALK_OK : varint32_long(buf, end, pos, value);
}

static int varint32_long(const uint8_t *buf, int64_t end, int64_t *pos, int64_t *value)
{
    uint64_t raw = 0;
    int shift = 0;
    for (;;) {
        if (*pos >= end)
            return WALK_PAST_END;
        uint8_t byte = buf[(*pos)++];
        raw |= (uint64_t)(byte & 0x7F) << shift;
        if (byte < 0x80) {
            if (shift == 28 && byte > 0x0F)
                return WALK_VARINT;  /* bits past the 32nd */
            break;
        }
        shift += 7;
        if (shift > 28)
            return WALK_VARINT;  /* a 6th byte */
    }
    *value = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    return WALK_OK;
}

/* :c:func:`varint` of any length, bounds-checked byte by byte. */
static int varint_long(const uint8_t *buf, int64_t end, int64_t *pos, int64_t *value)
{
    uint64_t raw = 0;
    int shift = 0, huge = 0;
    for (;;) {
        if (*pos >= end)
            return WALK_PAST_END;
        uint8_t byte = buf[(*pos)++];
        uint64_t bits = byte & 0x7F;
        if (shift < 63) {
            raw |= bits << shift;
        } else {  /* the 10th byte: only its lowest bit fits in 64 bits */
            raw |= (bits & 1) << 63;
            huge = (bits >> 1) != 0;
        }
        if (byte < 0x80)
            break;
        shift += 7;
        if (shift > 63)
            return WALK_VARINT;
    }
    if (huge)
        *value = (raw & 1) ? INT64_MIN : INT64_MAX;
    else
        *value = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    return WALK_OK;
}

/* Skip a varint-length-prefixed field (-1: null when nullable). A field that runs past
 * the end leaves *pos at end + 1: any later read fails, as does the record's frame check. */
static int skip_sized(const uint8_t *buf, int64_t end, int64_t *pos, int nullable)
{
    int64_t size;
    int rc = varint32(buf, end, pos, &size);
    if (rc != WALK_OK)
        return rc;
    if (size < 0)
        return (nullable && size == -1) ? WALK_OK : WALK_FIELD;
    if (*pos > end || size > end - *pos)
        *pos = end + 1;
    else
        *pos += size;
    return WALK_OK;
}

#define TRY(call) do { rc = (call); if (rc != WALK_OK) goto fail; } while (0)

static int walk(const uint8_t *buf, int64_t end, int64_t pos, int64_t count, int keyed,
                int64_t *out)
{
    int64_t index = 0, start = pos, value, stop, headers, h, probe;
    int rc;
    if (pos < 0)
        pos = start = 0;
    while (pos < end) {
        start = pos;
        TRY(varint32(buf, end, &pos, &value));
        if (value < 6 || value > end - pos) {
            rc = WALK_LENGTH;
            goto fail;
        }
        stop = pos + value;
        pos += 1;  /* attributes */
        TRY(varint(buf, end, &pos, &value));  /* timestamp delta */
        TRY(varint32(buf, end, &pos, &value));  /* offset delta */
        if (value != index) {
            rc = WALK_DELTA;
            goto fail;
        }
        if (keyed) {
            probe = pos;
            TRY(varint32(buf, end, &probe, &value));
            if (value == -1) {
                rc = WALK_NO_KEY;
                goto fail;
            }
        }
        TRY(skip_sized(buf, end, &pos, 1));  /* key */
        TRY(skip_sized(buf, end, &pos, 1));  /* value */
        TRY(varint32(buf, end, &pos, &headers));
        if (headers < 0) {
            rc = WALK_HEADERS;
            goto fail;
        }
        /* Each header takes at least two bytes or fails: at most end / 2 rounds. */
        for (h = 0; h < headers; h++) {
            TRY(skip_sized(buf, end, &pos, 0));  /* header key */
            TRY(skip_sized(buf, end, &pos, 1));  /* header value */
        }
        if (pos != stop) {
            rc = WALK_FRAME;
            goto fail;
        }
        index++;
    }
    if (index == count)
        return WALK_OK;
    rc = WALK_COUNT;
    start = pos;
fail:
    out[0] = index;
    out[1] = start;
    return rc;
}

/* CPython's Py_buffer and the two calls that fill and release it. */
typedef struct {
    void *buf;
    void *obj;
    ptrdiff_t len;
    ptrdiff_t itemsize;
    int readonly;
    int ndim;
    char *format;
    ptrdiff_t *shape;
    ptrdiff_t *strides;
    ptrdiff_t *suboffsets;
    void *internal;
} py_buffer;
extern int PyObject_GetBuffer(void *obj, py_buffer *view, int flags);
extern void PyBuffer_Release(py_buffer *view);
#define PYBUF_SIMPLE 0  /* contiguous bytes, else BufferError */

static _Thread_local int64_t failed_at[2];

int record_walk_object(void *obj, int64_t pos, int64_t count, int keyed)
{
    py_buffer view;
    int rc;
    if (PyObject_GetBuffer(obj, &view, PYBUF_SIMPLE) != 0)
        return -1;  /* the exception is set: ctypes raises it */
    rc = walk((const uint8_t *)view.buf, (int64_t)view.len, pos, count, keyed, failed_at);
    PyBuffer_Release(&view);
    return rc;
}

void record_walk_failure(int64_t *out)
{
    out[0] = failed_at[0];
    out[1] = failed_at[1];
}
