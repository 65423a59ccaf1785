/* The two loops of trace ingest that Python is slow at: walking ring-buffer pages record by record,
 * and gathering each record's bytes (and its strings) by offset. ticklab/trace/ringbuf.py holds the same
 * functions in Python (used when this module is not built); both give identical results.
 *
 * Page layout (include/linux/ring_buffer.h, events/header_page): u64 timestamp, a commit word
 * (4 or 8 bytes: data size in the low 27 bits, "missed events" flags in bits 31 and 30), then records
 * with a u32 header: 5 bits type_len, 27 bits time delta.
 *
 * Every read is bounds-checked: bytes past the end of the buffer read as zero (the gathers), and a page
 * that claims more data than it holds is an error naming its byte offset (the walk).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MISSED_EVENTS (1ULL << 31)
#define MISSED_STORED (1ULL << 30)
#define COMMIT_MASK ((1ULL << 27) - 1)

static uint32_t u32_at(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t u64_at(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

typedef struct { uint8_t *data; Py_ssize_t len, cap; } Grow;

static int grow_push(Grow *g, const void *item, Py_ssize_t size)
{
    if (g->len + size > g->cap) {
        Py_ssize_t cap = g->cap ? g->cap * 2 : 1 << 16;
        while (cap < g->len + size)
            cap *= 2;
        uint8_t *bigger = PyMem_Realloc(g->data, cap);
        if (!bigger)
            return -1;
        g->data = bigger;
        g->cap = cap;
    }
    memcpy(g->data + g->len, item, size);
    g->len += size;
    return 0;
}

static PyObject *grow_bytes(Grow *g)
{
    PyObject *out = PyBytes_FromStringAndSize((const char *)g->data, g->len);
    PyMem_Free(g->data);
    g->data = NULL;
    return out;
}

/* walk(buffer, start, length, page_size, commit_size, data_offset)
 *   -> (offsets: bytes of int64, stamps: bytes of uint64, types: bytes of uint16, lost: int, bad_page: int)
 * offsets are positions in buffer of each data record's payload, types its first two bytes (the event id,
 * zero past the end of buffer); bad_page is -1, or the buffer offset
 * of a page whose commit claims more bytes than the page holds (the walk stops there). */
static PyObject *walk(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, length, page_size, commit_size, data_offset;
    if (!PyArg_ParseTuple(args, "y*nnnnn", &view, &start, &length, &page_size, &commit_size, &data_offset))
        return NULL;
    const uint8_t *buf = view.buf;
    Grow offsets = {0}, stamps = {0}, types = {0};
    unsigned long long lost = 0;
    Py_ssize_t bad_page = -1;
    int failed = 0;
    if (start < 0 || length < 0 || start + length > view.len || page_size <= data_offset || data_offset < 12
        || (commit_size != 4 && commit_size != 8)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "walk: region or page geometry out of range");
        return NULL;
    }
    const Py_ssize_t limit = start + length;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t page = start; page + page_size <= start + length && !failed; page += page_size) {
        uint64_t timestamp = u64_at(buf + page);
        uint64_t commit = commit_size == 8 ? u64_at(buf + page + 8) : u32_at(buf + page + 8);
        Py_ssize_t size = (Py_ssize_t)(commit & COMMIT_MASK);
        Py_ssize_t position = page + data_offset, end = position + size;
        if (end > page + page_size) {
            bad_page = page;
            break;
        }
        if (commit & MISSED_EVENTS) {
            if (commit & MISSED_STORED) {
                if (end + commit_size > limit) { bad_page = page; break; }
                lost += commit_size == 8 ? u64_at(buf + end) : u32_at(buf + end);
            } else {
                lost += 1;
            }
        }
        while (position < end) {
            if (position + 4 > limit) { bad_page = page; break; }
            uint32_t header = u32_at(buf + position);
            uint32_t type_len = header & 0x1F, delta = header >> 5;
            if (type_len <= 28) {
                Py_ssize_t data, size_of;
                timestamp += delta;
                if (type_len == 0) {
                    if (position + 8 > limit) { bad_page = page; break; }
                    size_of = (Py_ssize_t)u32_at(buf + position + 4) - 4;
                    data = position + 8;
                } else {
                    size_of = (Py_ssize_t)type_len << 2;
                    data = position + 4;
                }
                int64_t at = data;
                uint16_t type = 0;
                if (data >= 0 && data + 2 <= view.len)
                    memcpy(&type, buf + data, 2);
                else if (data >= 0 && data + 1 == view.len)
                    type = buf[data];
                if (grow_push(&offsets, &at, 8) || grow_push(&stamps, &timestamp, 8) || grow_push(&types, &type, 2)) {
                    failed = 1;
                    break;
                }
                position = data + size_of;
            } else if (type_len == 30) {
                if (position + 8 > limit) { bad_page = page; break; }
                timestamp += ((uint64_t)u32_at(buf + position + 4) << 27) + delta;
                position += 8;
            } else if (type_len == 31) {
                if (position + 8 > limit) { bad_page = page; break; }
                timestamp = (((uint64_t)u32_at(buf + position + 4) << 27) + delta) | (timestamp & ~((1ULL << 59) - 1));
                position += 8;
            } else {
                if (delta == 0)
                    break;
                if (position + 8 > limit) { bad_page = page; break; }
                position += 4 + (Py_ssize_t)u32_at(buf + position + 4);
            }
        }
        if (bad_page >= 0)
            break;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (failed) {
        PyMem_Free(offsets.data);
        PyMem_Free(stamps.data);
        PyMem_Free(types.data);
        return PyErr_NoMemory();
    }
    PyObject *o = grow_bytes(&offsets), *s = grow_bytes(&stamps), *t = grow_bytes(&types);
    if (!o || !s || !t) {
        Py_XDECREF(o);
        Py_XDECREF(s);
        Py_XDECREF(t);
        return NULL;
    }
    return Py_BuildValue("(NNNKn)", o, s, t, lost, bad_page);
}

/* gather(buffer, offsets: int64 buffer, width) -> bytes of len(offsets) * width: each record's first
 * width bytes, zero past the end of buffer. */
static PyObject *gather(PyObject *self, PyObject *args)
{
    Py_buffer view, where;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "y*y*n", &view, &where, &width))
        return NULL;
    Py_ssize_t count = where.len / 8;
    if (width < 0 || (width && count > PY_SSIZE_T_MAX / width)) {
        PyBuffer_Release(&view);
        PyBuffer_Release(&where);
        PyErr_SetString(PyExc_ValueError, "gather: width out of range");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * width);
    if (out) {
        uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
        const uint8_t *src = view.buf;
        const int64_t *at = where.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < count; i++, dst += width) {
            int64_t from = at[i];
            Py_ssize_t have = from < 0 || from >= view.len ? 0 : view.len - from;
            if (have > width)
                have = width;
            if (have)
                memcpy(dst, src + from, have);
            memset(dst + have, 0, width - have);
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    PyBuffer_Release(&where);
    return out;
}

/* cstrings(buffer, starts: int64 buffer, limits: int64 buffer) -> (offsets: bytes of int32, data: bytes)
 * Arrow binary-array buffers of buffer[start:start+limit] cut at the first NUL (clamped to buffer). */
static PyObject *cstrings(PyObject *self, PyObject *args)
{
    Py_buffer view, starts, limits;
    if (!PyArg_ParseTuple(args, "y*y*y*", &view, &starts, &limits))
        return NULL;
    Py_ssize_t count = starts.len / 8;
    const uint8_t *src = view.buf;
    const int64_t *from = starts.buf, *limit = limits.buf;
    Grow data = {0};
    PyObject *offsets = NULL;
    int failed = limits.len / 8 != count;
    if (!failed && (offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * 4))) {
        int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
        off[0] = 0;
        for (Py_ssize_t i = 0; i < count && !failed; i++) {
            int64_t begin = from[i], stop = from[i] + (limit[i] > 0 ? limit[i] : 0);
            if (begin < 0) begin = 0;
            if (stop > view.len) stop = view.len;
            Py_ssize_t size = 0;
            if (stop > begin) {
                const uint8_t *nul = memchr(src + begin, 0, stop - begin);
                size = nul ? nul - (src + begin) : stop - begin;
            }
            if (data.len + size > INT32_MAX || (size && grow_push(&data, src + begin, size)))
                failed = 1;
            off[i + 1] = (int32_t)data.len;
        }
    }
    PyBuffer_Release(&view);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&limits);
    if (failed || !offsets) {
        Py_XDECREF(offsets);
        PyMem_Free(data.data);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "cstrings: mismatched arrays or more than 2 GiB of strings");
        return NULL;
    }
    return Py_BuildValue("(NN)", offsets, grow_bytes(&data));
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "Walk ring-buffer pages: record offsets, timestamps, lost events, bad page."},
    {"gather", gather, METH_VARARGS, "Each record's first width bytes, zero past the end."},
    {"cstrings", cstrings, METH_VARARGS, "NUL-terminated strings at offsets, as Arrow binary buffers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ringbuf", NULL, -1, methods};

PyMODINIT_FUNC PyInit__ringbuf(void) { return PyModule_Create(&module); }
