/*
 * pt_unpickle.c - a restricted pickle machine for torch.save's data.pkl.
 *
 * A pickle is a program for a stack machine whose GLOBAL and REDUCE opcodes
 * import and call arbitrary Python functions: os.system is one opcode away.
 * This machine runs the opcodes that build plain data (protocol 2, which
 * torch.save writes, plus the few protocol 3-5 forms of the same data) and
 * recognises exactly three globals, none of which it "calls" in any real
 * sense: torch._utils._rebuild_tensor_v2 turns (storage, offset, size,
 * stride, ...) into a checked tensor descriptor, collections.OrderedDict()
 * makes an empty dict, and the torch.<X>Storage classes name a dtype inside
 * a persistent id. Any other global stops the load with EPX_ERR_REFUSED
 * before anything else happens; opcodes that only serve other objects
 * (INST, OBJ, NEWOBJ, EXT*, BUILD with state) are refused or unsupported.
 *
 * What must stay true: every length and index read from the pickle is
 * checked against the bytes left or the structures present before it is
 * used; the stack, mark stack and memo grow only by what the input pays for
 * (each entry costs at least one input byte, memo indices are capped by the
 * pickle's length); no recursion depends on the input. As in Python's own
 * unpickler (its "metastack"), opcodes never reach below the innermost MARK.
 */
#include "pt_internal.h"

#include <string.h>

typedef struct vm {
    epx_pt_file *f;
    const uint8_t *p;
    size_t len, pos, op_at;
    epx_pt_value **stack;
    size_t sp, scap;
    size_t *marks;
    size_t nmarks, mcap;
    epx_pt_value **memo;
    size_t memo_len, memo_count;
    epxi_pt_storage_fn resolve;
    void *ctx;
    epx_error *err;
} vm;

/* Opcodes by name, as pickletools lists them. */
enum {
    OP_MARK = '(',
    OP_STOP = '.',
    OP_POP = '0',
    OP_POP_MARK = '1',
    OP_DUP = '2',
    OP_BININT = 'J',
    OP_BININT1 = 'K',
    OP_BININT2 = 'M',
    OP_NONE = 'N',
    OP_BINPERSID = 'Q',
    OP_REDUCE = 'R',
    OP_BINUNICODE = 'X',
    OP_APPEND = 'a',
    OP_BUILD = 'b',
    OP_GLOBAL = 'c',
    OP_DICT = 'd',
    OP_EMPTY_DICT = '}',
    OP_APPENDS = 'e',
    OP_BINGET = 'h',
    OP_INST = 'i',
    OP_LONG_BINGET = 'j',
    OP_EMPTY_LIST = ']',
    OP_OBJ = 'o',
    OP_BINPUT = 'q',
    OP_LONG_BINPUT = 'r',
    OP_SETITEM = 's',
    OP_TUPLE = 't',
    OP_EMPTY_TUPLE = ')',
    OP_SETITEMS = 'u',
    OP_BINFLOAT = 'G',
    OP_PROTO = 0x80,
    OP_NEWOBJ = 0x81,
    OP_EXT1 = 0x82,
    OP_EXT2 = 0x83,
    OP_EXT4 = 0x84,
    OP_TUPLE1 = 0x85,
    OP_TUPLE2 = 0x86,
    OP_TUPLE3 = 0x87,
    OP_NEWTRUE = 0x88,
    OP_NEWFALSE = 0x89,
    OP_LONG1 = 0x8a,
    OP_LONG4 = 0x8b,
    OP_SHORT_BINUNICODE = 0x8c,
    OP_BINUNICODE8 = 0x8d,
    OP_STACK_GLOBAL = 0x93,
    OP_MEMOIZE = 0x94,
    OP_FRAME = 0x95,
    OP_NEWOBJ_EX = 0x92
};

/* ---- input -------------------------------------------------------------- */

static epx_status need(vm *m, size_t n) {
    if (m->len - m->pos < n)
        return epxi_fail(m->err, EPX_ERR_PARSE,
                         "the pickle is truncated: %zu bytes needed, %zu left", n, m->len - m->pos);
    return EPX_OK;
}

static uint64_t read_le(vm *m, size_t n) {
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) x |= (uint64_t)m->p[m->pos + i] << (8 * i);
    m->pos += n;
    return x;
}

/* Copy at most 120 bytes of an input name into buf, printable only, so a
 * hostile name cannot garble the message. */
static void printable(char *buf, size_t cap, const uint8_t *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap && i < 120; i++)
        buf[k++] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
    if (n > 120 && k + 4 < cap) buf[k++] = '.', buf[k++] = '.', buf[k++] = '.';
    buf[k] = '\0';
}

/* Python decodes BINUNICODE as UTF-8 ("surrogatepass"); so does this. */
static bool utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t extra;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0)
            extra = 1, cp = c & 0x1f;
        else if ((c & 0xf0) == 0xe0)
            extra = 2, cp = c & 0x0f;
        else if ((c & 0xf8) == 0xf0)
            extra = 3, cp = c & 0x07;
        else
            return false;
        if (n - i <= extra) return false;
        for (size_t k = 1; k <= extra; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) ||
            (extra == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return false; /* overlong or beyond Unicode */
        i += extra + 1;
    }
    return true;
}

/* ---- stack, marks, memo ------------------------------------------------- */

static size_t frame_base(const vm *m) { return m->nmarks ? m->marks[m->nmarks - 1] : 0; }

static epx_status push(vm *m, epx_pt_value *v) {
    if (v == NULL) return m->err ? m->err->status : EPX_ERR_NOMEM;
    if (m->sp == m->scap) {
        size_t nc = m->scap ? m->scap * 2 : 64, bytes;
        epx_pt_value **ns = epxi_mul_size(nc, sizeof *ns, &bytes) ? realloc(m->stack, bytes) : NULL;
        if (ns == NULL) return epxi_fail(m->err, EPX_ERR_NOMEM, "out of memory growing the stack");
        m->stack = ns;
        m->scap = nc;
    }
    m->stack[m->sp++] = v;
    return EPX_OK;
}

static epx_status pop(vm *m, epx_pt_value **out) {
    if (m->sp <= frame_base(m))
        return epxi_fail(m->err, EPX_ERR_PARSE, "stack underflow: the opcode needs a value");
    *out = m->stack[--m->sp];
    return EPX_OK;
}

static epx_status top(vm *m, epx_pt_value **out) {
    if (m->sp <= frame_base(m))
        return epxi_fail(m->err, EPX_ERR_PARSE, "stack underflow: the opcode needs a value");
    *out = m->stack[m->sp - 1];
    return EPX_OK;
}

static epx_status mark(vm *m) {
    if (m->nmarks == m->mcap) {
        size_t nc = m->mcap ? m->mcap * 2 : 16, bytes;
        size_t *nm = epxi_mul_size(nc, sizeof *nm, &bytes) ? realloc(m->marks, bytes) : NULL;
        if (nm == NULL) return epxi_fail(m->err, EPX_ERR_NOMEM, "out of memory growing marks");
        m->marks = nm;
        m->mcap = nc;
    }
    m->marks[m->nmarks++] = m->sp;
    return EPX_OK;
}

/* Pop the innermost mark: the items above it are stack[*first .. sp). The
 * caller removes them by setting sp = *first. */
static epx_status pop_mark(vm *m, size_t *first) {
    if (m->nmarks == 0) return epxi_fail(m->err, EPX_ERR_PARSE, "no MARK to pop");
    *first = m->marks[--m->nmarks];
    return EPX_OK;
}

static epx_status memo_put(vm *m, uint64_t idx) {
    epx_pt_value *v = NULL;
    EPX_TRY(top(m, &v));
    /* An honest pickle numbers its memo 0, 1, 2 ... and pays >= 2 bytes per
     * entry, so an index beyond the pickle's length is a lie. */
    if (idx >= m->len)
        return epxi_fail(m->err, EPX_ERR_PARSE,
                         "memo index %llu is beyond what a pickle of %zu bytes can store",
                         (unsigned long long)idx, m->len);
    if (idx >= m->memo_len) {
        size_t nl = m->memo_len ? m->memo_len : 64;
        while (nl <= idx) nl *= 2;
        if (nl > m->len) nl = m->len;
        size_t bytes;
        epx_pt_value **nm = epxi_mul_size(nl, sizeof *nm, &bytes) ? realloc(m->memo, bytes) : NULL;
        if (nm == NULL) return epxi_fail(m->err, EPX_ERR_NOMEM, "out of memory growing the memo");
        memset(nm + m->memo_len, 0, (nl - m->memo_len) * sizeof *nm);
        m->memo = nm;
        m->memo_len = nl;
    }
    if (m->memo[idx] == NULL) m->memo_count++;
    m->memo[idx] = v;
    return EPX_OK;
}

static epx_status memo_get(vm *m, uint64_t idx) {
    if (idx >= m->memo_len || m->memo[idx] == NULL)
        return epxi_fail(m->err, EPX_ERR_PARSE, "memo index %llu was never stored",
                         (unsigned long long)idx);
    return push(m, m->memo[idx]);
}

/* ---- values ------------------------------------------------------------- */

static epx_pt_value *new_int(vm *m, int kind, int64_t i) {
    epx_pt_value *v = epxi_pt_new(m->f, kind, m->err);
    if (v) v->u.i = i;
    return v;
}

/* A length of `lenbytes` little-endian bytes, then that many bytes: *bytes
 * points at them (inside the pickle) and the reader moves past them. `what`
 * names the value in the message when the length claims more than is left. */
static epx_status take_counted(vm *m, size_t lenbytes, const char *what, const uint8_t **bytes,
                               uint64_t *len) {
    EPX_TRY(need(m, lenbytes));
    const uint64_t n = read_le(m, lenbytes);
    if (n > m->len - m->pos)
        return epxi_fail(m->err, EPX_ERR_PARSE,
                         "%s claims %llu bytes but only %zu remain in the pickle", what,
                         (unsigned long long)n, m->len - m->pos);
    *bytes = m->p + m->pos;
    *len = n;
    m->pos += (size_t)n;
    return EPX_OK;
}

static epx_status push_string(vm *m, size_t lenbytes) {
    const uint8_t *s = NULL;
    uint64_t n = 0;
    EPX_TRY(take_counted(m, lenbytes, "a string", &s, &n));
    if (!utf8_ok(s, (size_t)n))
        return epxi_fail(m->err, EPX_ERR_PARSE, "a string is not valid UTF-8");
    return push(m, epxi_pt_new_string(m->f, (const char *)s, (size_t)n, m->err));
}

/* LONG1 / LONG4: n bytes of little-endian two's complement. Wider than 64
 * bits is accepted only when the extra bytes are pure sign extension. */
static epx_status push_long(vm *m, size_t lenbytes) {
    const uint8_t *b = NULL;
    uint64_t n = 0;
    EPX_TRY(take_counted(m, lenbytes, "an integer", &b, &n));
    if (n == 0) return push(m, new_int(m, EPX_PT_INT, 0));
    bool neg = (b[n - 1] & 0x80) != 0;
    uint64_t x = neg ? ~(uint64_t)0 : 0;
    for (uint64_t i = 0; i < n && i < 8; i++) {
        x &= ~((uint64_t)0xff << (8 * i));
        x |= (uint64_t)b[i] << (8 * i);
    }
    for (uint64_t i = 8; i < n; i++)
        if (b[i] != (neg ? 0xff : 0x00))
            return epxi_fail(m->err, EPX_ERR_UNSUPPORTED,
                             "an integer of %llu bytes does not fit 64 bits",
                             (unsigned long long)n);
    if (n > 8 && (((x >> 63) != 0) != neg))
        return epxi_fail(m->err, EPX_ERR_UNSUPPORTED, "an integer does not fit 64 bits");
    return push(m, new_int(m, EPX_PT_INT, (int64_t)x));
}

/* Build a tuple from stack[first .. sp) and replace those items by it. */
static epx_status make_tuple(vm *m, size_t first) {
    epx_pt_value *t = epxi_pt_new(m->f, EPX_PT_TUPLE, m->err);
    if (t == NULL) return m->err ? m->err->status : EPX_ERR_NOMEM;
    for (size_t i = first; i < m->sp; i++) EPX_TRY(epxi_pt_seq_push(t, m->stack[i], m->err));
    m->sp = first;
    return push(m, t);
}

static epx_status tuple_n(vm *m, size_t n) {
    if (m->sp - frame_base(m) < n)
        return epxi_fail(m->err, EPX_ERR_PARSE, "stack underflow: TUPLE%zu needs %zu values", n, n);
    return make_tuple(m, m->sp - n);
}

/* ---- globals ------------------------------------------------------------ */

static bool name_is(const uint8_t *s, size_t n, const char *lit) {
    return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

/* The one place a global is admitted. The refusal names what the pickle
 * asked for, so a user sees at once which object or exploit it carried. */
static epx_status find_global(vm *m, const uint8_t *mod, size_t mlen, const uint8_t *name,
                              size_t nlen) {
    epx_pt_value *g = NULL;
    if (name_is(mod, mlen, "torch._utils") && name_is(name, nlen, "_rebuild_tensor_v2")) {
        g = epxi_pt_new(m->f, EPXI_PT_GLOBAL, m->err);
        if (g) g->u.global.which = EPXI_PT_G_REBUILD_TENSOR_V2;
    } else if (name_is(mod, mlen, "collections") && name_is(name, nlen, "OrderedDict")) {
        g = epxi_pt_new(m->f, EPXI_PT_GLOBAL, m->err);
        if (g) g->u.global.which = EPXI_PT_G_ORDERED_DICT;
    } else if (name_is(mod, mlen, "torch") &&
               epxi_pt_storage_dtype((const char *)name, nlen) >= 0) {
        g = epxi_pt_new(m->f, EPXI_PT_GLOBAL, m->err);
        if (g) {
            g->u.global.which = EPXI_PT_G_STORAGE;
            g->u.global.dtype = (epx_pt_dtype)epxi_pt_storage_dtype((const char *)name, nlen);
        }
    } else {
        char a[128], b[128];
        printable(a, sizeof a, mod, mlen);
        printable(b, sizeof b, name, nlen);
        return epxi_fail(m->err, EPX_ERR_REFUSED,
                         "refused to load global %s.%s: epx builds only tensors "
                         "(torch._utils._rebuild_tensor_v2 over torch.*Storage), dicts "
                         "(collections.OrderedDict), lists, tuples and scalars, as "
                         "torch.load(weights_only=True) does; nothing was executed",
                         a, b);
    }
    return push(m, g);
}

/* GLOBAL's operands are two newline-terminated lines. */
static epx_status read_line(vm *m, const uint8_t **s, size_t *n) {
    const uint8_t *start = m->p + m->pos;
    size_t left = m->len - m->pos;
    const uint8_t *nl = memchr(start, '\n', left < 512 ? left : 512);
    if (nl == NULL)
        return epxi_fail(m->err, EPX_ERR_PARSE,
                         "a GLOBAL name is not terminated by a newline within 512 bytes");
    *s = start;
    *n = (size_t)(nl - start);
    m->pos += *n + 1;
    return EPX_OK;
}

static epx_status op_global(vm *m, bool inst) {
    const uint8_t *mod = NULL, *name = NULL;
    size_t mlen = 0, nlen = 0;
    EPX_TRY(read_line(m, &mod, &mlen));
    EPX_TRY(read_line(m, &name, &nlen));
    if (inst) {
        /* INST builds an instance of the class directly: nothing epx admits
         * is built that way, so every INST is refused, naming its class. */
        char a[128], b[128];
        printable(a, sizeof a, mod, mlen);
        printable(b, sizeof b, name, nlen);
        return epxi_fail(m->err, EPX_ERR_REFUSED,
                         "refused to instantiate %s.%s (INST): epx builds only tensors, dicts, "
                         "lists, tuples and scalars; nothing was executed",
                         a, b);
    }
    return find_global(m, mod, mlen, name, nlen);
}

static epx_status op_stack_global(vm *m) {
    epx_pt_value *name = NULL, *mod = NULL;
    EPX_TRY(pop(m, &name));
    EPX_TRY(pop(m, &mod));
    if (name->kind != EPX_PT_STRING || mod->kind != EPX_PT_STRING)
        return epxi_fail(m->err, EPX_ERR_PARSE, "STACK_GLOBAL needs two strings");
    return find_global(m, (const uint8_t *)mod->u.str.bytes, mod->u.str.len,
                       (const uint8_t *)name->u.str.bytes, name->u.str.len);
}

/* ---- persistent ids and REDUCE ------------------------------------------ */

/* ('storage', torch.<X>Storage, key, location, numel) -> a storage value
 * over the bytes of data/<key>, whose size must match numel exactly. */
static epx_status op_binpersid(vm *m) {
    epx_pt_value *pid = NULL;
    EPX_TRY(pop(m, &pid));
    if (pid->kind != EPX_PT_TUPLE || pid->u.seq.n != 5)
        return epxi_fail(m->err, EPX_ERR_PARSE,
                         "a persistent id must be the tuple ('storage', class, key, location, "
                         "numel); found a %s of %zu items",
                         epx_pt_kind_str((epx_pt_kind)pid->kind), epx_pt_value_len(pid));
    epx_pt_value **it = pid->u.seq.items;
    size_t klen = 0;
    const char *tag = epx_pt_value_string(it[0], NULL);
    const char *key = epx_pt_value_string(it[2], &klen);
    if (tag == NULL || strcmp(tag, "storage") != 0)
        return epxi_fail(m->err, EPX_ERR_PARSE, "a persistent id's first item must be 'storage'");
    if (it[1]->kind != EPXI_PT_GLOBAL || it[1]->u.global.which != EPXI_PT_G_STORAGE)
        return epxi_fail(m->err, EPX_ERR_PARSE,
                         "a persistent id's second item must be a torch storage class");
    if (key == NULL || epx_pt_value_string(it[3], NULL) == NULL || it[4]->kind != EPX_PT_INT)
        return epxi_fail(m->err, EPX_ERR_PARSE,
                         "a persistent id needs a string key, a string location and an int "
                         "numel");
    const epx_pt_dtype dt = it[1]->u.global.dtype;
    const int64_t numel = it[4]->u.i;
    if (klen == 0 || klen > 64 || memchr(key, '/', klen) != NULL || memchr(key, '\0', klen) != NULL)
        return epxi_fail(m->err, EPX_ERR_PARSE,
                         "storage key of %zu bytes is not a plain entry name of 1..64 bytes", klen);
    const void *bytes = NULL;
    size_t nbytes = 0;
    uint64_t want = 0;
    bool bad = numel < 0 ||
               __builtin_mul_overflow((uint64_t)numel, (uint64_t)epx_pt_dtype_size(dt), &want);
    EPX_TRY(m->resolve(m->ctx, m->f, key, klen, bad ? UINT64_MAX : want, &bytes, &nbytes, m->err));
    if (bad || want != nbytes)
        return epxi_fail(m->err, EPX_ERR_PARSE,
                         "storage '%s' claims %lld %s elements (%s) but data/%s holds %zu bytes",
                         key, (long long)numel, epx_pt_dtype_str(dt), epxi_pt_storage_name(dt), key,
                         nbytes);
    epx_pt_value *s = epxi_pt_new(m->f, EPXI_PT_STORAGE, m->err);
    if (s == NULL) return m->err ? m->err->status : EPX_ERR_NOMEM;
    s->u.storage.dtype = dt;
    s->u.storage.numel = numel;
    s->u.storage.bytes = bytes;
    return push(m, s);
}

/* A tuple of non-negative ints into dims[]; returns the count via *n. */
static epx_status int_tuple(vm *m, const epx_pt_value *t, const char *what, int64_t *dims,
                            int32_t *n) {
    if (t->kind != EPX_PT_TUPLE)
        return epxi_fail(m->err, EPX_ERR_PARSE, "tensor %s must be a tuple, found a %s", what,
                         epx_pt_kind_str((epx_pt_kind)t->kind));
    if (t->u.seq.n > EPX_PT_MAX_DIMS)
        return epxi_fail(m->err, EPX_ERR_UNSUPPORTED, "tensor %s has %zu dimensions, above %d",
                         what, t->u.seq.n, EPX_PT_MAX_DIMS);
    for (size_t i = 0; i < t->u.seq.n; i++) {
        const epx_pt_value *x = t->u.seq.items[i];
        if (x->kind != EPX_PT_INT || x->u.i < 0)
            return epxi_fail(m->err, EPX_ERR_PARSE, "tensor %s[%zu] must be an int >= 0", what, i);
        dims[i] = x->u.i;
    }
    *n = (int32_t)t->u.seq.n;
    return EPX_OK;
}

/* _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
 * backward_hooks[, metadata]): only the descriptor is kept. */
static epx_status rebuild_tensor(vm *m, const epx_pt_value *args) {
    if (args->u.seq.n != 6 && args->u.seq.n != 7)
        return epxi_fail(m->err, EPX_ERR_PARSE,
                         "_rebuild_tensor_v2 takes 6 or 7 arguments, the pickle gives %zu",
                         args->u.seq.n);
    epx_pt_value *const *a = args->u.seq.items;
    if (a[0]->kind != EPXI_PT_STORAGE)
        return epxi_fail(m->err, EPX_ERR_PARSE,
                         "_rebuild_tensor_v2's first argument must be a storage, found a %s",
                         epx_pt_kind_str((epx_pt_kind)a[0]->kind));
    if (a[1]->kind != EPX_PT_INT || a[1]->u.i < 0)
        return epxi_fail(m->err, EPX_ERR_PARSE, "tensor storage offset must be an int >= 0");
    if (a[4]->kind != EPX_PT_BOOL || a[5]->kind != EPX_PT_DICT)
        return epxi_fail(m->err, EPX_ERR_PARSE,
                         "tensor requires_grad must be a bool and backward_hooks a dict");
    epx_pt_value *v = epxi_pt_new(m->f, EPX_PT_TENSOR, m->err);
    if (v == NULL) return m->err ? m->err->status : EPX_ERR_NOMEM;
    epx_pt_tensor *t = v->u.tensor.t;
    int32_t ns = 0, nst = 0;
    EPX_TRY(int_tuple(m, a[2], "size", t->shape, &ns));
    EPX_TRY(int_tuple(m, a[3], "stride", t->strides, &nst));
    if (ns != nst)
        return epxi_fail(m->err, EPX_ERR_PARSE, "tensor size has %d dimensions but stride has %d",
                         ns, nst);
    t->ndim = ns;
    t->dtype = a[0]->u.storage.dtype;
    t->storage_offset = a[1]->u.i;
    t->storage_numel = a[0]->u.storage.numel;
    t->storage = a[0]->u.storage.bytes;
    int64_t numel;
    EPX_TRY(epx_pt_tensor_numel(t, &numel, m->err));
    return push(m, v);
}

static epx_status op_reduce(vm *m) {
    epx_pt_value *args = NULL, *fn = NULL;
    EPX_TRY(pop(m, &args));
    EPX_TRY(pop(m, &fn));
    if (fn->kind != EPXI_PT_GLOBAL)
        return epxi_fail(m->err, EPX_ERR_PARSE, "REDUCE calls a %s, not a global",
                         epx_pt_kind_str((epx_pt_kind)fn->kind));
    if (args->kind != EPX_PT_TUPLE)
        return epxi_fail(m->err, EPX_ERR_PARSE, "REDUCE arguments must be a tuple, found a %s",
                         epx_pt_kind_str((epx_pt_kind)args->kind));
    switch (fn->u.global.which) {
    case EPXI_PT_G_REBUILD_TENSOR_V2: return rebuild_tensor(m, args);
    case EPXI_PT_G_ORDERED_DICT:
        if (args->u.seq.n != 0)
            return epxi_fail(m->err, EPX_ERR_UNSUPPORTED,
                             "collections.OrderedDict is built with %zu arguments; torch.save "
                             "writes it empty and fills it with SETITEMS",
                             args->u.seq.n);
        return push(m, epxi_pt_new(m->f, EPX_PT_DICT, m->err));
    default:
        return epxi_fail(m->err, EPX_ERR_UNSUPPORTED,
                         "torch.%s is called as a function; storages are only read through "
                         "persistent ids",
                         epxi_pt_storage_name(fn->u.global.dtype));
    }
}

/* ---- containers --------------------------------------------------------- */

static epx_status op_append(vm *m) {
    epx_pt_value *v = NULL, *list = NULL;
    EPX_TRY(pop(m, &v));
    EPX_TRY(top(m, &list));
    if (list->kind != EPX_PT_LIST)
        return epxi_fail(m->err, EPX_ERR_PARSE, "APPEND to a %s, not a list",
                         epx_pt_kind_str((epx_pt_kind)list->kind));
    return epxi_pt_seq_push(list, v, m->err);
}

static epx_status op_appends(vm *m) {
    size_t first = 0;
    EPX_TRY(pop_mark(m, &first));
    epx_pt_value *list;
    if (first <= frame_base(m))
        return epxi_fail(m->err, EPX_ERR_PARSE, "APPENDS has no list below its MARK");
    list = m->stack[first - 1];
    if (list->kind != EPX_PT_LIST)
        return epxi_fail(m->err, EPX_ERR_PARSE, "APPENDS to a %s, not a list",
                         epx_pt_kind_str((epx_pt_kind)list->kind));
    for (size_t i = first; i < m->sp; i++) EPX_TRY(epxi_pt_seq_push(list, m->stack[i], m->err));
    m->sp = first;
    return EPX_OK;
}

static epx_status op_setitem(vm *m) {
    epx_pt_value *v = NULL, *k = NULL, *d = NULL;
    EPX_TRY(pop(m, &v));
    EPX_TRY(pop(m, &k));
    EPX_TRY(top(m, &d));
    if (d->kind != EPX_PT_DICT)
        return epxi_fail(m->err, EPX_ERR_PARSE, "SETITEM on a %s, not a dict",
                         epx_pt_kind_str((epx_pt_kind)d->kind));
    return epxi_pt_dict_set(d, k, v, m->err);
}

static epx_status op_setitems(vm *m) {
    size_t first = 0;
    EPX_TRY(pop_mark(m, &first));
    if (first <= frame_base(m))
        return epxi_fail(m->err, EPX_ERR_PARSE, "SETITEMS has no dict below its MARK");
    epx_pt_value *d = m->stack[first - 1];
    if (d->kind != EPX_PT_DICT)
        return epxi_fail(m->err, EPX_ERR_PARSE, "SETITEMS on a %s, not a dict",
                         epx_pt_kind_str((epx_pt_kind)d->kind));
    if ((m->sp - first) % 2 != 0)
        return epxi_fail(m->err, EPX_ERR_PARSE, "SETITEMS has an odd number (%zu) of items",
                         m->sp - first);
    for (size_t i = first; i < m->sp; i += 2)
        EPX_TRY(epxi_pt_dict_set(d, m->stack[i], m->stack[i + 1], m->err));
    m->sp = first;
    return EPX_OK;
}

/* BUILD sets an object's state. The objects epx builds have none, so only
 * an empty state (None or {}) is accepted, as a no-op. */
static epx_status op_build(vm *m) {
    epx_pt_value *state = NULL, *obj = NULL;
    EPX_TRY(pop(m, &state));
    EPX_TRY(top(m, &obj));
    if (state->kind == EPX_PT_NONE || (state->kind == EPX_PT_DICT && state->u.dict.n == 0))
        return EPX_OK;
    return epxi_fail(
        m->err, EPX_ERR_UNSUPPORTED, "BUILD gives a %s state to a %s: epx reads plain tensors only",
        epx_pt_kind_str((epx_pt_kind)state->kind), epx_pt_kind_str((epx_pt_kind)obj->kind));
}

/* ---- the loop ----------------------------------------------------------- */

static epx_status step(vm *m, int op, bool *done) {
    epx_pt_value *v = NULL;
    size_t first = 0;
    switch (op) {
    case OP_PROTO:
        EPX_TRY(need(m, 1));
        if (m->p[m->pos] > 5)
            return epxi_fail(m->err, EPX_ERR_UNSUPPORTED, "pickle protocol %d is newer than 5",
                             m->p[m->pos]);
        m->pos++;
        return EPX_OK;
    case OP_FRAME:
        EPX_TRY(need(m, 8));
        m->pos += 8; /* framing is a hint for buffered readers */
        return EPX_OK;
    case OP_STOP:
        EPX_TRY(top(m, &v));
        if (v->has_internal || v->kind >= EPXI_PT_GLOBAL)
            return epxi_fail(m->err, EPX_ERR_PARSE,
                             "the pickle's result holds a bare storage or class, not data");
        m->f->root = v;
        *done = true;
        return EPX_OK;
    case OP_MARK: return mark(m);
    case OP_POP:
        if (m->sp > frame_base(m)) {
            m->sp--;
            return EPX_OK;
        }
        /* On an empty frame POP drops the MARK itself, as Python's does. */
        EPX_TRY(pop_mark(m, &first));
        m->sp = first;
        return EPX_OK;
    case OP_POP_MARK:
        EPX_TRY(pop_mark(m, &first));
        m->sp = first;
        return EPX_OK;
    case OP_DUP: EPX_TRY(top(m, &v)); return push(m, v);
    case OP_NONE: return push(m, epxi_pt_new(m->f, EPX_PT_NONE, m->err));
    case OP_NEWTRUE: return push(m, new_int(m, EPX_PT_BOOL, 1));
    case OP_NEWFALSE: return push(m, new_int(m, EPX_PT_BOOL, 0));
    case OP_BININT:
        EPX_TRY(need(m, 4));
        return push(m, new_int(m, EPX_PT_INT, (int32_t)(uint32_t)read_le(m, 4)));
    case OP_BININT1:
        EPX_TRY(need(m, 1));
        return push(m, new_int(m, EPX_PT_INT, (int64_t)read_le(m, 1)));
    case OP_BININT2:
        EPX_TRY(need(m, 2));
        return push(m, new_int(m, EPX_PT_INT, (int64_t)read_le(m, 2)));
    case OP_LONG1: return push_long(m, 1);
    case OP_LONG4: return push_long(m, 4);
    case OP_BINFLOAT: {
        EPX_TRY(need(m, 8));
        uint64_t bits = 0;
        for (int i = 0; i < 8; i++) bits = (bits << 8) | m->p[m->pos + (size_t)i]; /* big-endian */
        m->pos += 8;
        v = epxi_pt_new(m->f, EPX_PT_FLOAT, m->err);
        if (v) memcpy(&v->u.f, &bits, sizeof bits);
        return push(m, v);
    }
    case OP_BINUNICODE: return push_string(m, 4);
    case OP_SHORT_BINUNICODE: return push_string(m, 1);
    case OP_BINUNICODE8: return push_string(m, 8);
    case OP_EMPTY_DICT: return push(m, epxi_pt_new(m->f, EPX_PT_DICT, m->err));
    case OP_EMPTY_LIST: return push(m, epxi_pt_new(m->f, EPX_PT_LIST, m->err));
    case OP_EMPTY_TUPLE: return push(m, epxi_pt_new(m->f, EPX_PT_TUPLE, m->err));
    case OP_TUPLE: EPX_TRY(pop_mark(m, &first)); return make_tuple(m, first);
    case OP_TUPLE1: return tuple_n(m, 1);
    case OP_TUPLE2: return tuple_n(m, 2);
    case OP_TUPLE3: return tuple_n(m, 3);
    case OP_APPEND: return op_append(m);
    case OP_APPENDS: return op_appends(m);
    case OP_SETITEM: return op_setitem(m);
    case OP_SETITEMS: return op_setitems(m);
    case OP_BINPUT: EPX_TRY(need(m, 1)); return memo_put(m, read_le(m, 1));
    case OP_LONG_BINPUT: EPX_TRY(need(m, 4)); return memo_put(m, read_le(m, 4));
    case OP_MEMOIZE: return memo_put(m, m->memo_count);
    case OP_BINGET: EPX_TRY(need(m, 1)); return memo_get(m, read_le(m, 1));
    case OP_LONG_BINGET: EPX_TRY(need(m, 4)); return memo_get(m, read_le(m, 4));
    case OP_GLOBAL: return op_global(m, false);
    case OP_INST: return op_global(m, true);
    case OP_STACK_GLOBAL: return op_stack_global(m);
    case OP_REDUCE: return op_reduce(m);
    case OP_BINPERSID: return op_binpersid(m);
    case OP_BUILD: return op_build(m);
    case OP_OBJ:
    case OP_NEWOBJ:
    case OP_NEWOBJ_EX:
        return epxi_fail(m->err, EPX_ERR_REFUSED,
                         "the pickle builds a class instance (opcode 0x%02x); epx builds only "
                         "tensors, dicts, lists, tuples and scalars; nothing was executed",
                         op);
    case OP_EXT1:
    case OP_EXT2:
    case OP_EXT4:
        return epxi_fail(m->err, EPX_ERR_REFUSED,
                         "the pickle names a global through the extension registry (opcode "
                         "0x%02x), which epx refuses; nothing was executed",
                         op);
    default:
        return epxi_fail(m->err, EPX_ERR_UNSUPPORTED,
                         "opcode 0x%02x is not one torch.save writes for tensors, dicts, lists "
                         "and scalars",
                         op);
    }
}

epx_status epxi_pt_unpickle(epx_pt_file *f, const uint8_t *pkl, size_t len,
                            epxi_pt_storage_fn resolve, void *ctx, epx_error *err) {
    epx_error local = {0};
    vm m = {0};
    m.f = f;
    m.p = pkl;
    m.len = len;
    m.resolve = resolve;
    m.ctx = ctx;
    m.err = err ? err : &local;
    bool done = false;
    epx_status st = EPX_OK;
    while (!done) {
        if (m.pos >= m.len) {
            st = epxi_fail(m.err, EPX_ERR_PARSE, "the pickle ends without STOP");
            break;
        }
        m.op_at = m.pos;
        int op = m.p[m.pos++];
        st = step(&m, op, &done);
        if (st != EPX_OK) {
            epxi_error_prefix(m.err, "data.pkl byte %zu (opcode 0x%02x)", m.op_at, op);
            break;
        }
    }
    free(m.stack);
    free(m.marks);
    free(m.memo);
    return st;
}
