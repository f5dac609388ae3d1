/* A strict, narrow scanner of Kineto event arrays into fixed-size records (decode.py's fast path).
 *
 * Why: on a 620 MB trace the typed msgspec decode plus the per-column passes over its structs cost
 * about 3 s of CPU per core-GHz; this scanner reads the bytes once and writes every field the
 * analysis reads into one record per complete ("X") event.
 *
 * How it stays exact: it accepts only input whose meaning it is sure of, and gives up on the whole
 * piece otherwise (returns None). decode.py then decodes that piece with msgspec exactly as before,
 * so a defect, an odd type, an escaped key, a surrogate escape, a number outside int64 or anything
 * else unusual is handled (and worded) by the msgspec path. What it accepts it reads as msgspec
 * would: JSON grammar checked on every value (skipped ones too), last duplicate key wins, floats
 * correctly rounded (exact fast path or CPython's dtoa), strings handed back as raw bytes that
 * Python decodes with msgspec once per distinct string.
 *
 * Trace content is untrusted: every read is bounds-checked against the end of the buffer, nesting
 * is limited, and nothing is evaluated. Tested against the msgspec path (tests/trace/test_scan.py),
 * on the repository's real traces and on mutated ones.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h> /* baseline on x86-64: no run-time detection needed */
#endif

#define MAX_DEPTH 64
#if defined(__GNUC__)
#define HOT static inline __attribute__((always_inline))
#else
#define HOT static inline
#endif
#define ABSENT_NS INT64_MIN

/* One complete event. scanned.py's REC_DTYPE mirrors this layout field by field. */
typedef struct {
    double ts;          /* µs (fast mode); NaN when absent */
    int64_t ts_ns;      /* ns from the text (exact mode); INT64_MIN when absent or beyond int64 */
    double dur;         /* µs; 0 when absent */
    int64_t pid, tid;   /* 0 when absent or a string */
    int64_t stream, corr, nbytes; /* -1 when absent */
    double blocks, warps, occ;    /* NaN when absent */
    int32_t name, cat;            /* ids into the scanner's string tables */
    int32_t pid_str, tid_str;     /* id into the strings table when the id is a string, else -1 */
    int32_t shape;    /* id into the shapes table of "Input Dims" NUL "Input type" (raw); -1 without dims */
    int32_t has_coll; /* args carry collective metadata (decoded by Python from the args span) */
    int64_t grid_off, conc_off, args_off; /* raw JSON value spans in the buffer */
    int32_t grid_len, conc_len, args_len; /* 0 when absent */
    int32_t pad_;
} Rec;

/* ---- interning table of raw string bytes (open addressing; ids in first-seen order) ---- */
typedef struct {
    uint64_t seed; /* random per scanner: crafted strings cannot be made to collide */
    char *arena;
    Py_ssize_t arena_len, arena_cap;
    Py_ssize_t *offs;
    Py_ssize_t *lens;
    uint64_t *hashes;
    Py_ssize_t n, cap;
    int32_t *slots; /* -1 empty */
    Py_ssize_t nslots;
} Table;

/* a[0, n) == b[0, n) for a short n, without a call to memcmp: eight bytes at a time (longer ones: memcmp). */
HOT int same_bytes(const char *a, const char *b, Py_ssize_t n) {
    if (n > 64) return memcmp(a, b, (size_t)n) == 0;
    for (; n >= 8; a += 8, b += 8, n -= 8) {
        uint64_t x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (x != y) return 0;
    }
    for (; n > 0; a++, b++, n--)
        if (*a != *b) return 0;
    return 1;
}

static uint64_t hash_bytes(uint64_t seed, const char *s, Py_ssize_t n) {
    uint64_t h = seed ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n) memcpy(&w, s, (size_t)n);
    h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
    h ^= h >> 32;
    return h;
}

static void table_free(Table *t) {
    PyMem_Free(t->arena);
    PyMem_Free(t->offs);
    PyMem_Free(t->lens);
    PyMem_Free(t->hashes);
    PyMem_Free(t->slots);
    memset(t, 0, sizeof(*t));
}

static int table_rehash(Table *t, Py_ssize_t nslots) {
    int32_t *slots = PyMem_Malloc((size_t)nslots * sizeof(int32_t));
    if (!slots) return -1;
    memset(slots, 0xff, (size_t)nslots * sizeof(int32_t));
    for (Py_ssize_t i = 0; i < t->n; i++) {
        Py_ssize_t j = (Py_ssize_t)(t->hashes[i] & (uint64_t)(nslots - 1));
        while (slots[j] >= 0) j = (j + 1) & (nslots - 1);
        slots[j] = (int32_t)i;
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->nslots = nslots;
    return 0;
}

/* A probe this long means colliding keys (crafted, or a poor hash): the piece is left to msgspec
 * rather than slowed down quadratically. */
#define MAX_PROBE 256

/* Id of the bytes [s, s+n); added when unseen. -2 on memory error, -1 after MAX_PROBE collisions. */
static int32_t table_id(Table *t, const char *s, Py_ssize_t n) {
    uint64_t h = hash_bytes(t->seed, s, n);
    if (t->nslots == 0 && table_rehash(t, 1024) < 0) return -2;
    Py_ssize_t mask = t->nslots - 1;
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)mask);
    int probes = 0;
    while (t->slots[j] >= 0) {
        int32_t i = t->slots[j];
        if (t->hashes[i] == h && t->lens[i] == n && same_bytes(t->arena + t->offs[i], s, n))
            return i;
        if (++probes > MAX_PROBE) return -1;
        j = (j + 1) & mask;
    }
    if (t->n >= INT32_MAX - 1) return -1;
    if (t->n == t->cap) {
        Py_ssize_t cap = t->cap ? t->cap * 2 : 256;
        Py_ssize_t *offs = PyMem_Realloc(t->offs, (size_t)cap * sizeof(Py_ssize_t));
        if (!offs) return -2;
        t->offs = offs;
        Py_ssize_t *lens = PyMem_Realloc(t->lens, (size_t)cap * sizeof(Py_ssize_t));
        if (!lens) return -2;
        t->lens = lens;
        uint64_t *hashes = PyMem_Realloc(t->hashes, (size_t)cap * sizeof(uint64_t));
        if (!hashes) return -2;
        t->hashes = hashes;
        t->cap = cap;
    }
    if (t->arena_len + n > t->arena_cap) {
        Py_ssize_t cap = t->arena_cap ? t->arena_cap : 4096;
        while (cap < t->arena_len + n) cap *= 2;
        char *arena = PyMem_Realloc(t->arena, (size_t)cap);
        if (!arena) return -2;
        t->arena = arena;
        t->arena_cap = cap;
    }
    if (n) memcpy(t->arena + t->arena_len, s, (size_t)n);
    int32_t id = (int32_t)t->n;
    t->offs[id] = t->arena_len;
    t->lens[id] = n;
    t->hashes[id] = h;
    t->arena_len += n;
    t->n++;
    t->slots[j] = id;
    if (t->n * 2 > t->nslots && table_rehash(t, t->nslots * 2) < 0) return -2;
    return id;
}

/* Forget the entries from id `n` on. Safe for open addressing: an older key's probe never
 * passes through a slot filled after it was inserted. */
static void table_rollback(Table *t, Py_ssize_t n) {
    if (n < 0 || n >= t->n) return;
    for (Py_ssize_t j = 0; j < t->nslots; j++)
        if (t->slots[j] >= n) t->slots[j] = -1;
    t->arena_len = t->offs[n];
    t->n = n;
}

static PyObject *table_new_entries(Table *t, Py_ssize_t from) {
    PyObject *out = PyList_New(t->n - from);
    if (!out) return NULL;
    for (Py_ssize_t i = from; i < t->n; i++) {
        PyObject *b = PyBytes_FromStringAndSize(t->arena + t->offs[i], t->lens[i]);
        if (!b) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i - from, b);
    }
    return out;
}

/* ---- strict JSON scanning ---- */
typedef struct {
    const char *p, *end;
} Cur;

HOT void ws(Cur *c) {
    const char *p = c->p, *end = c->end;
    /* Kineto writes one space or none: the common case is one comparison. */
    while (p < end && (unsigned char)*p <= ' ' && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    c->p = p;
}

static inline int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* p + the index of the lowest flagged byte of a nonzero SWAR mask (high bit of each byte), or NULL
 * where the byte order cannot be read off the mask: the caller then finishes byte by byte. */
HOT const char *first_flagged(const char *p, uint64_t hit) {
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return p + (__builtin_ctzll(hit) >> 3);
#else
    (void)hit;
    (void)p;
    return NULL;
#endif
}

/* The first byte at or after p that is '"', '\\' or a control character (or end). Eight bytes at a
 * time: a word with none of them is skipped whole; otherwise the bytes are looked at one by one. */
HOT const char *plain_run(const char *p, const char *end) {
#if defined(__SSE2__) && defined(__GNUC__)
    /* Sixteen bytes at a time where SSE2 is baseline (x86-64): a byte is a hit when it equals '"' or
     * '\\', or is at most 0x1F (max_epu8(x, 0x1F) == 0x1F). Every load lies inside [p, end). */
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'), ctl = _mm_set1_epi8(0x1F);
    while (end - p >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)p);
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bslash)),
                                   _mm_cmpeq_epi8(_mm_max_epu8(x, ctl), ctl));
        int m = _mm_movemask_epi8(hit);
        if (m) return p + __builtin_ctz((unsigned)m);
        p += 16;
    }
#endif
    while (end - p >= 8) {
        uint64_t w, q, b, hit;
        memcpy(&w, p, 8);
        q = w ^ (ONES * '"');
        b = w ^ (ONES * '\\');
        /* A byte of q or b is zero, or a byte of w is below 0x20. The classic has-less test can flag
         * bytes above a real hit (a borrow), never below one: the lowest flag is the first hit. */
        hit = (((q - ONES) & ~q) | ((b - ONES) & ~b) | ((w - ONES * 0x20) & ~w)) & HIGHS;
        if (hit) {
            const char *at = first_flagged(p, hit);
            if (at) return at;
            break; /* finished byte by byte */
        }
        p += 8;
    }
    while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) p++;
    return p;
}

/* A string at c->p ('"'): sets [*s, *s + *n) to its raw content and *esc when it has escapes.
 * 0 on success. Control characters and surrogate escapes fail (msgspec's path decides those). */
HOT int scan_string(Cur *c, const char **s, Py_ssize_t *n, int *esc) {
    const char *p = c->p + 1;
    const char *start = p;
    *esc = 0;
    for (;;) {
        p = plain_run(p, c->end);
        if (p >= c->end) return -1;
        if (*p == '"') break;
        if ((unsigned char)*p < 0x20) return -1;
        /* backslash */
        *esc = 1;
        if (p + 1 >= c->end) return -1;
        char e = p[1];
        if (e == 'u') {
            if (p + 6 > c->end) return -1;
            int v = 0;
            for (int k = 2; k < 6; k++) {
                int h = hexval(p[k]);
                if (h < 0) return -1;
                v = v * 16 + h;
            }
            if (v >= 0xD800 && v <= 0xDFFF) return -1;
            p += 6;
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
            p += 2;
        } else {
            return -1;
        }
    }
    *s = start;
    *n = p - start;
    c->p = p + 1;
    return 0;
}

/* The first byte at or after p that is not an ASCII digit (or end). Eight bytes at a time: x = byte ^ '0'
 * is a digit's value when its high nibble is 0 and x + 6 does not reach 16; a carry out of a byte can
 * flag bytes above a real non-digit, never below one. */
HOT const char *digit_run(const char *p, const char *end) {
    while (end - p >= 8) {
        uint64_t w, x, hit;
        memcpy(&w, p, 8);
        x = w ^ (ONES * '0');
        hit = (x | (x + ONES * 6)) & (ONES * 0xF0);
        if (hit) {
            const char *at = first_flagged(p, hit);
            if (at) return at;
            break; /* finished byte by byte */
        }
        p += 8;
    }
    while (p < end && *p >= '0' && *p <= '9') p++;
    return p;
}

/* The value of the (checked) digits [p, e), at most 19 of them. Eight at a time on little-endian
 * machines (Lemire's SWAR reduction): a 16-digit timestamp is two steps, not sixteen multiplies in a row. */
HOT uint64_t digits_value(const char *p, const char *e) {
    uint64_t m = 0;
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; e - p >= 8; p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w = ((w & 0x0F0F0F0F0F0F0F0FULL) * 2561) >> 8;
        w = ((w & 0x00FF00FF00FF00FFULL) * 6553601) >> 16;
        w = ((w & 0x0000FFFF0000FFFFULL) * 42949672960001ULL) >> 32;
        m = m * 100000000ULL + w;
    }
#endif
    for (; p < e; p++) m = m * 10 + (uint64_t)(*p - '0');
    return m;
}

/* A number at c->p; checks JSON's grammar. *is_int: no fraction and no exponent. */
HOT int scan_number(Cur *c, int *is_int) {
    const char *p = c->p;
    *is_int = 1;
    if (p < c->end && *p == '-') p++;
    if (p >= c->end) return -1;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        p = digit_run(p, c->end);
    } else {
        return -1;
    }
    if (p < c->end && *p == '.') {
        *is_int = 0;
        p++;
        if (p >= c->end || !(*p >= '0' && *p <= '9')) return -1;
        p = digit_run(p, c->end);
    }
    if (p < c->end && (*p == 'e' || *p == 'E')) {
        *is_int = 0;
        p++;
        if (p < c->end && (*p == '+' || *p == '-')) p++;
        if (p >= c->end || !(*p >= '0' && *p <= '9')) return -1;
        p = digit_run(p, c->end);
    }
    c->p = p;
    return 0;
}

/* A member's key at c->p ('"') and the ':' after it; leaves c->p at the value. */
HOT int member_key(Cur *c, const char **ks, Py_ssize_t *kn, int *esc) {
    if (c->p >= c->end || *c->p != '"' || scan_string(c, ks, kn, esc) < 0) return -1;
    /* Kineto's ": " before a value that starts at once: three predictable tests. */
    if (c->end - c->p >= 3 && c->p[0] == ':' && c->p[1] == ' ' && (unsigned char)c->p[2] > ' ') {
        c->p += 2;
        return 0;
    }
    ws(c);
    if (c->p >= c->end || *c->p != ':') return -1;
    c->p++;
    ws(c);
    return 0;
}

/* After a member or element: 1 when a ',' follows (c->p at the next one), 0 past `close`, -1 else. */
HOT int next_member(Cur *c, char close) {
    /* Kineto's ", " before the next member or element. */
    if (c->end - c->p >= 3 && c->p[0] == ',' && c->p[1] == ' ' && (unsigned char)c->p[2] > ' ') {
        c->p += 2;
        return 1;
    }
    ws(c);
    if (c->p >= c->end) return -1;
    if (*c->p == ',') {
        c->p++;
        ws(c);
        return 1;
    }
    if (*c->p == close) {
        c->p++;
        return 0;
    }
    return -1;
}

/* Past '{' or '[' at c->p: 1 when a member follows, 0 when the container is empty (c->p past it). */
HOT int open_container(Cur *c, char close) {
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 0;
    }
    return 1;
}

static int skip_value(Cur *c, int depth);

static int skip_container(Cur *c, int depth, char close, int is_object) {
    if (depth > MAX_DEPTH) return -1;
    int more = open_container(c, close);
    while (more > 0) {
        const char *s;
        Py_ssize_t n;
        int esc;
        if (is_object && member_key(c, &s, &n, &esc) < 0) return -1;
        if (skip_value(c, depth + 1) < 0) return -1;
        more = next_member(c, close);
    }
    return more;
}

static int skip_literal(Cur *c, const char *lit, Py_ssize_t n) {
    if (c->end - c->p < n || memcmp(c->p, lit, (size_t)n) != 0) return -1;
    c->p += n;
    return 0;
}

static int skip_value(Cur *c, int depth) {
    if (c->p >= c->end) return -1;
    switch (*c->p) {
    case '"': {
        const char *s;
        Py_ssize_t n;
        int esc;
        return scan_string(c, &s, &n, &esc);
    }
    case '{':
        return skip_container(c, depth, '}', 1);
    case '[':
        return skip_container(c, depth, ']', 0);
    case 't':
        return skip_literal(c, "true", 4);
    case 'f':
        return skip_literal(c, "false", 5);
    case 'n':
        return skip_literal(c, "null", 4);
    default: {
        int is_int;
        return scan_number(c, &is_int);
    }
    }
}

/* ---- number conversion ---- */
static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The correctly rounded double of the (grammar-checked) number [s, e). -1 when out of range. */
static int to_double(const char *s, const char *e, double *out) {
    const char *p = s;
    int neg = *p == '-';
    p += neg;
    uint64_t m = 0;
    int digits = 0, frac = 0, fast = 1, int_form = 1;
    for (; p < e && *p >= '0' && *p <= '9'; p++) {
        if (m || *p != '0') digits++;
        if (digits > 19) fast = 0;
        else m = m * 10 + (uint64_t)(*p - '0');
    }
    if (p < e && *p == '.') {
        int_form = 0;
        for (p++; p < e && *p >= '0' && *p <= '9'; p++) {
            if (m || *p != '0') digits++;
            if (digits > 19) fast = 0;
            else {
                m = m * 10 + (uint64_t)(*p - '0');
                frac++;
            }
        }
    }
    if (p < e) fast = 0, int_form = 0; /* exponent: leave it to dtoa */
    if (int_form && m == 0) neg = 0; /* msgspec reads "-0" as the int 0, a float +0.0 */
    if (fast && (frac == 0 || (m <= (1ULL << 53) && frac <= 22))) {
        /* An integer of up to 19 digits converts with one rounding (the hardware's, to nearest even);
         * m <= 2^53 and 10^frac are exact doubles, so the quotient is rounded once (Clinger). */
        double v = frac ? (double)m / POW10[frac] : (double)m;
        *out = neg ? -v : v;
        return 0;
    }
    char small[64];
    char *buf = small;
    Py_ssize_t n = e - s;
    if (n >= (Py_ssize_t)sizeof(small)) {
        buf = PyMem_Malloc((size_t)n + 1);
        if (!buf) return -1;
    }
    memcpy(buf, s, (size_t)n);
    buf[n] = 0;
    char *endp = NULL;
    double v = PyOS_string_to_double(buf, &endp, NULL);
    int ok = endp == buf + n && !PyErr_Occurred();
    if (buf != small) PyMem_Free(buf);
    if (!ok) {
        PyErr_Clear();
        return -1;
    }
    if (isinf(v)) return -1; /* msgspec: "Number out of range" */
    *out = v;
    return 0;
}

/* The int64 of an integer-form number [s, e); -1 when outside int64. */
static int to_int64(const char *s, const char *e, int64_t *out) {
    const char *p = s;
    int neg = *p == '-';
    p += neg;
    uint64_t v = 0;
    if (e - p <= 19) { /* below 10^19 < UINT64_MAX: no overflow check per digit */
        v = digits_value(p, e);
    } else {
        for (; p < e; p++) {
            uint64_t d = (uint64_t)(*p - '0');
            if (v > (UINT64_MAX - d) / 10) return -1;
            v = v * 10 + d;
        }
    }
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1) return -1;
        *out = (int64_t)(0 - v);
    } else {
        if (v > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)v;
    }
    return 0;
}

/* Exact ns of a µs timestamp's text, as decode.py's _raw_to_ns: whole µs * 1000 + the first three
 * decimals, the fourth rounding half up; ABSENT_NS when that is beyond int64 (raw_ts_to_ns reads such a
 * value as missing). Negative or with an exponent: -1 (left to the msgspec path). */
static int to_ns(const char *s, const char *e, int64_t *out) {
    const char *p = s;
    if (*p == '-') return -1;
    uint64_t whole = 0;
    int too_big = 0;
    for (; p < e && *p >= '0' && *p <= '9'; p++) {
        if (whole > (uint64_t)INT64_MAX / 1000) too_big = 1;
        else whole = whole * 10 + (uint64_t)(*p - '0');
    }
    uint64_t ns = 0;
    if (p < e && *p == '.') {
        p++;
        uint64_t scale = 100;
        int k = 0;
        for (; p < e && *p >= '0' && *p <= '9'; p++, k++) {
            if (k < 3) {
                ns += (uint64_t)(*p - '0') * scale;
                scale /= 10;
            } else if (k == 3 && *p >= '5') {
                ns += 1;
            }
        }
    }
    if (p < e) return -1; /* exponent */
    if (too_big || whole > (uint64_t)INT64_MAX / 1000 || whole * 1000 > (uint64_t)INT64_MAX - ns) {
        *out = ABSENT_NS;
        return 0;
    }
    *out = (int64_t)(whole * 1000 + ns);
    return 0;
}

/* ---- events ---- */
typedef struct {
    const char *s, *e; /* value span; s == NULL when absent */
    char kind;         /* first byte of the value */
    char is_int;       /* a number without fraction or exponent */
} Span;

static inline int is_number_start(char ch) {
    return ch == '-' || (ch >= '0' && ch <= '9');
}

static inline int key_is(const char *s, Py_ssize_t n, const char *lit, Py_ssize_t litn) {
    /* memcmp of the literal's constant length: compiled inline, not a call */
    return n == litn && s[0] == lit[0] && memcmp(s, lit, (size_t)litn) == 0;
}
#define KEY(lit) key_is(ks, kn, lit, (Py_ssize_t)sizeof(lit) - 1)

typedef struct {
    PyObject_HEAD
    Table names, cats, strs, shapes;
    char *key;         /* scratch for a shapes key */
    Py_ssize_t key_cap;
} Scanner;

/* A value span (after ws) at c->p, validated; fills `sp`. */
HOT int take_span(Cur *c, Span *sp) {
    sp->s = c->p;
    sp->kind = c->p < c->end ? *c->p : 0;
    sp->is_int = 0;
    if (is_number_start(sp->kind)) {
        /* Checked once here; read_float / read_int then only convert. */
        int is_int;
        if (scan_number(c, &is_int) < 0) return -1;
        sp->is_int = (char)is_int;
    } else if (sp->kind == '"') { /* most values: a string, scanned here rather than through skip_value */
        const char *s;
        Py_ssize_t n;
        int esc;
        if (scan_string(c, &s, &n, &esc) < 0) return -1;
    } else if (skip_value(c, 1) < 0) {
        return -1;
    }
    sp->e = c->p;
    return 0;
}

static int read_string_id(Table *t, const Span *sp, int32_t *id) {
    if (sp->kind != '"') return -1;
    /* The raw bytes between the quotes: Python decodes each distinct one once (escapes, UTF-8). */
    *id = table_id(t, sp->s + 1, sp->e - sp->s - 2);
    return *id < 0 ? *id : 0;
}

static int read_float(const Span *sp, double *out) {
    if (!is_number_start(sp->kind)) return -1;
    int neg = sp->kind == '-';
    Py_ssize_t digits = sp->e - sp->s - neg;
    if (sp->is_int && digits <= 19) {
        /* The common timestamp and duration: JSON allows no leading zeros, so these are all of its
         * significant digits; the conversion rounds once, as to_double's fast path. "-0" is msgspec's
         * int 0, a float +0.0. */
        uint64_t m = digits_value(sp->s + neg, sp->e);
        double v = (double)m;
        *out = neg && m ? -v : v;
        return 0;
    }
    return to_double(sp->s, sp->e, out);
}

static int read_int(const Span *sp, int64_t *out) {
    if (!is_number_start(sp->kind) || !sp->is_int) return -1;
    return to_int64(sp->s, sp->e, out);
}

/* pid / tid: an int64 or a string (its id in the strings table). */
static int read_ident(Scanner *sc, const Span *sp, int64_t *v, int32_t *str_id) {
    *v = 0;
    *str_id = -1;
    if (!sp->s) return 0;
    if (sp->kind == '"') return read_string_id(&sc->strs, sp, str_id);
    return read_int(sp, v);
}

/* An args object at c->p ('{'), read into r in one pass. Returns -1 when it is not JSON; sets *bad
 * when a value the analysis reads has a type msgspec's Args would reject (fatal only for "X"). */
/* The args keys the analysis reads (decode.py's Args), and what each gives. */
enum { ARG_INT, ARG_FLOAT, ARG_GRID, ARG_CONCRETE, ARG_DIMS, ARG_TYPES, ARG_COLL };
typedef struct {
    const char *key;
    Py_ssize_t len;
    int kind;
    size_t field; /* ARG_INT / ARG_FLOAT: where in Rec */
} ArgKey;
#define ARG(key, kind, field) {key, (Py_ssize_t)sizeof(key) - 1, kind, field}
static const ArgKey ARG_KEYS[] = {
    ARG("stream", ARG_INT, offsetof(Rec, stream)),
    ARG("correlation", ARG_INT, offsetof(Rec, corr)),
    ARG("bytes", ARG_INT, offsetof(Rec, nbytes)),
    ARG("blocks per SM", ARG_FLOAT, offsetof(Rec, blocks)),
    ARG("warps per SM", ARG_FLOAT, offsetof(Rec, warps)),
    ARG("est. achieved occupancy %", ARG_FLOAT, offsetof(Rec, occ)),
    ARG("grid", ARG_GRID, 0),
    ARG("Concrete Inputs", ARG_CONCRETE, 0),
    ARG("Input Dims", ARG_DIMS, 0),
    ARG("Input type", ARG_TYPES, 0),
    /* Collective metadata: the args object is handed to msgspec whole (scanned.py). */
    ARG("Collective name", ARG_COLL, 0),
    ARG("dtype", ARG_COLL, 0),
    ARG("In msg nelems", ARG_COLL, 0),
    ARG("Out msg nelems", ARG_COLL, 0),
    ARG("Group size", ARG_COLL, 0),
    ARG("Process Group Name", ARG_COLL, 0),
    ARG("Seq", ARG_COLL, 0),
};

#define N_ARG_KEYS (sizeof(ARG_KEYS) / sizeof(ARG_KEYS[0]))
#define MAX_ARG_KEY 32
/* The entries of each key length (set up once by index_arg_keys): at most three share one. */
static unsigned char ARGS_OF_LEN[MAX_ARG_KEY][4];

static void index_arg_keys(void) {
    memset(ARGS_OF_LEN, 0xff, sizeof(ARGS_OF_LEN));
    for (size_t i = 0; i < N_ARG_KEYS; i++) {
        unsigned char *at = ARGS_OF_LEN[ARG_KEYS[i].len];
        while (*at != 0xff) at++; /* room for three, the fourth slot stays 0xff */
        *at = (unsigned char)i;
    }
}

/* The entry of an args key, or NULL (most keys: External id, Trace name, Call stack ...): only the
 * entries of the key's length are compared. */
HOT const ArgKey *arg_key(const char *ks, Py_ssize_t kn) {
    if (kn >= MAX_ARG_KEY) return NULL;
    for (const unsigned char *at = ARGS_OF_LEN[kn]; *at != 0xff; at++) {
        const ArgKey *a = &ARG_KEYS[*at];
        if (a->key[0] == ks[0] && same_bytes(a->key, ks, kn)) return a;
    }
    return NULL;
}

/* Where an args object's shape texts lie (raw JSON values), for the shapes key. */
typedef struct {
    const char *dims, *types;
    Py_ssize_t dims_n, types_n;
} ShapeText;

static int read_args(const char *base, Cur *c, Rec *r, ShapeText *st, int *bad) {
    int more = open_container(c, '}');
    while (more > 0) {
        const char *ks;
        Py_ssize_t kn;
        int esc;
        if (member_key(c, &ks, &kn, &esc) < 0) return -1;
        if (esc) *bad = 1; /* msgspec matches keys after unescaping: leave such a piece to it */
        Span v;
        if (take_span(c, &v) < 0) return -1;
        Py_ssize_t off = v.s - base;
        int32_t len = (int32_t)(v.e - v.s);
        if (v.e - v.s > INT32_MAX) *bad = 1;
        const ArgKey *ak = arg_key(ks, kn);
        if (ak) {
            switch (ak->kind) {
            case ARG_INT:
                if (read_int(&v, (int64_t *)((char *)r + ak->field)) < 0) *bad = 1;
                break;
            case ARG_FLOAT:
                if (read_float(&v, (double *)((char *)r + ak->field)) < 0) *bad = 1;
                break;
            case ARG_GRID:
                r->grid_off = off, r->grid_len = len;
                break;
            case ARG_CONCRETE:
                r->conc_off = off, r->conc_len = len;
                break;
            case ARG_DIMS:
                st->dims = v.s, st->dims_n = v.e - v.s;
                break;
            case ARG_TYPES:
                st->types = v.s, st->types_n = v.e - v.s;
                break;
            default: /* ARG_COLL */
                r->has_coll = 1;
            }
        }
        more = next_member(c, '}');
    }
    return more;
}

/* The shapes id of an op's "Input Dims" and "Input type" texts: their raw bytes joined by NUL (a byte
 * no JSON text holds), as decode.py's shape_rows keys them. -1 without dims. */
static int shape_id(Scanner *sc, const ShapeText *st, int32_t *id) {
    *id = -1;
    if (!st->dims) return 0;
    Py_ssize_t n = st->dims_n + 1 + st->types_n;
    if (n > sc->key_cap) {
        Py_ssize_t cap = n * 2;
        char *k = PyMem_Realloc(sc->key, (size_t)cap);
        if (!k) return -2;
        sc->key = k;
        sc->key_cap = cap;
    }
    memcpy(sc->key, st->dims, (size_t)st->dims_n);
    sc->key[st->dims_n] = 0;
    if (st->types_n) memcpy(sc->key + st->dims_n + 1, st->types, (size_t)st->types_n);
    *id = table_id(&sc->shapes, sc->key, n);
    return *id < 0 ? *id : 0;
}

static void rec_defaults(Rec *r) {
    r->ts = NAN;
    r->ts_ns = ABSENT_NS;
    r->dur = 0.0;
    r->pid = r->tid = 0;
    r->stream = r->corr = r->nbytes = -1;
    r->blocks = r->warps = r->occ = NAN;
    r->name = r->cat = 0;
    r->pid_str = r->tid_str = -1;
    r->shape = -1;
    r->has_coll = 0;
    r->grid_off = r->conc_off = r->args_off = -1;
    r->grid_len = r->conc_len = r->args_len = 0;
    r->pad_ = 0;
}

/* Growable output, written straight into the bytes object handed back (no copy at the end). */
typedef struct {
    PyObject *obj; /* bytes of cap bytes, NULL until the first push */
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t cap) {
    if (!b->obj) {
        b->obj = PyBytes_FromStringAndSize(NULL, cap);
        if (!b->obj) return -1;
    } else if (_PyBytes_Resize(&b->obj, cap) < 0) { /* frees the object and sets it NULL on failure */
        return -1;
    }
    b->data = PyBytes_AS_STRING(b->obj);
    b->cap = cap;
    return 0;
}

static void *buf_push(Buf *b, Py_ssize_t n) {
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 1 << 16;
        while (cap < b->len + n) cap *= 2;
        if (buf_grow(b, cap) < 0) return NULL;
    }
    void *out = b->data + b->len;
    b->len += n;
    return out;
}

/* The bytes written (a new reference), or NULL with an exception set. */
static PyObject *buf_take(Buf *b) {
    if (!b->obj) return PyBytes_FromStringAndSize("", 0);
    if (b->len != b->cap && _PyBytes_Resize(&b->obj, b->len) < 0) return NULL;
    PyObject *out = b->obj;
    b->obj = NULL;
    return out;
}

enum { K_PH, K_CAT, K_NAME, K_TS, K_DUR, K_PID, K_TID, K_ARGS, K_N };

/* Phases msgspec's union skips unbuilt (decode.py's SKIPPED_PH), besides "X" and "i". */
static int skipped_phase(const char *s, Py_ssize_t n) {
    static const char *const PH = "sftMICbenBEPONDR";
    if (n != 1) return 0;
    return strchr(PH, s[0]) != NULL && s[0] != 0;
}

/* One event object at c->p. Returns 0, or -1 to give the piece up, -2 on memory error. */
static int scan_event(Scanner *sc, const char *base, Cur *c, int exact, Buf *recs, Buf *instants,
                      Py_ssize_t *n_instants) {
    const char *obj_start = c->p;
    if (c->p >= c->end || *c->p != '{') return -1;
    int more = open_container(c, '}');
    if (!more) return -1; /* {}: no "ph", which msgspec's union rejects */
    Span f[K_N];
    /* Only .s marks a field present: eight stores, not a memset of the array (5% of the scan). */
    for (int i = 0; i < K_N; i++) f[i].s = NULL;
    Rec tmp;
    ShapeText st = {NULL, NULL, 0, 0};
    int args_bad = 0;
    rec_defaults(&tmp);
    while (more > 0) {
        const char *ks;
        Py_ssize_t kn;
        int esc;
        if (member_key(c, &ks, &kn, &esc) < 0 || esc) return -1;
        int k = -1;
        if (kn == 2) {
            k = ks[0] == 'p' && ks[1] == 'h' ? K_PH : ks[0] == 't' && ks[1] == 's' ? K_TS : -1;
        } else if (kn == 3) {
            k = KEY("cat") ? K_CAT : KEY("dur") ? K_DUR : KEY("pid") ? K_PID : KEY("tid") ? K_TID : -1;
        } else if (kn == 4) {
            k = KEY("name") ? K_NAME : KEY("args") ? K_ARGS : -1;
        }
        /* A known key twice: msgspec type-checks every copy (and rejects a second tag), the last one
         * wins. Kineto never writes one twice: leave it to msgspec. So too any key of decode.py's
         * padding fields ("~torchdoctor padding"), which msgspec checks are null. */
        if ((k >= 0 && f[k].s) || (kn > 0 && ks[0] == '~')) return -1;
        Span v;
        if (k == K_ARGS && c->p < c->end && *c->p == '{') {
            /* Read in the same pass (once: a second "args" was given up above). */
            v.s = c->p;
            v.kind = '{';
            if (read_args(base, c, &tmp, &st, &args_bad) < 0) return -1;
            v.e = c->p;
        } else if (take_span(c, &v) < 0) {
            return -1;
        }
        if (k >= 0) f[k] = v;
        more = next_member(c, '}');
    }
    if (more < 0) return -1;
    const Span *ph = &f[K_PH];
    if (!ph->s || ph->kind != '"') return -1;
    const char *phs = ph->s + 1;
    Py_ssize_t phn = ph->e - ph->s - 2;
    if (phn == 1 && phs[0] == 'i') {
        int64_t *span = buf_push(instants, 2 * sizeof(int64_t));
        if (!span) return -2;
        span[0] = obj_start - base;
        span[1] = c->p - obj_start;
        (*n_instants)++;
        return 0;
    }
    int complete = phn == 1 && phs[0] == 'X';
    if (!complete && skipped_phase(phs, phn)) {
        if (phs[0] == 'I') (*n_instants)++;
        return 0;
    }
    if (!complete) return -1;

    if (f[K_ARGS].s && (f[K_ARGS].kind != '{' || args_bad)) return -1;
    Rec *r = buf_push(recs, sizeof(Rec));
    if (!r) return -2;
    *r = tmp; /* the args' fields (defaults when there are none) */
    static const char QUOTES[] = "\"\"";
    const Span EMPTY = {QUOTES, QUOTES + 2, '"'};
    int rc;
    if ((rc = read_string_id(&sc->cats, f[K_CAT].s ? &f[K_CAT] : &EMPTY, &r->cat)) < 0) return rc;
    if ((rc = read_string_id(&sc->names, f[K_NAME].s ? &f[K_NAME] : &EMPTY, &r->name)) < 0) return rc;
    if (f[K_TS].s) {
        if (exact) {
            if (!is_number_start(f[K_TS].kind) || to_ns(f[K_TS].s, f[K_TS].e, &r->ts_ns) < 0) return -1;
        } else if (read_float(&f[K_TS], &r->ts) < 0) {
            return -1;
        }
    }
    if (f[K_DUR].s && read_float(&f[K_DUR], &r->dur) < 0) return -1;
    if ((rc = read_ident(sc, &f[K_PID], &r->pid, &r->pid_str)) < 0) return rc;
    if ((rc = read_ident(sc, &f[K_TID], &r->tid, &r->tid_str)) < 0) return rc;
    if ((rc = shape_id(sc, &st, &r->shape)) < 0) return rc;
    if (f[K_ARGS].s) {
        if (r->has_coll) {
            if (f[K_ARGS].e - f[K_ARGS].s > INT32_MAX) return -1;
            r->args_off = f[K_ARGS].s - base;
            r->args_len = (int32_t)(f[K_ARGS].e - f[K_ARGS].s);
        }
    }
    return 0;
}

static PyObject *Scanner_scan(Scanner *self, PyObject *args) {
    Py_buffer view;
    int exact, rest_ok = 0;
    if (!PyArg_ParseTuple(args, "y*p|p", &view, &exact, &rest_ok)) return NULL;
    Py_ssize_t n0 = self->names.n, c0 = self->cats.n, s0 = self->strs.n, h0 = self->shapes.n;
    Buf recs = {0}, instants = {0};
    /* Room for one record per 256 bytes of input up front (Kineto's events take 300-600): the output
     * is seldom moved by growing. Pages not written to cost nothing. */
    if (view.len > (1 << 20) && buf_grow(&recs, (view.len / 256) * (Py_ssize_t)sizeof(Rec)) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t n_instants = 0;
    const char *base = view.buf;
    Cur c = {base, base + view.len};
    int rc = 0;
    ws(&c);
    if (c.p >= c.end || *c.p != '[') rc = -1;
    else {
        int more = open_container(&c, ']');
        while (more > 0) {
            rc = scan_event(self, base, &c, exact, &recs, &instants, &n_instants);
            if (rc < 0) break;
            more = next_member(&c, ']');
        }
        if (rc == 0 && more < 0) rc = -1;
        ws(&c);
        /* rest_ok: the array may be followed by more of a document (the top-level keys after it). */
        if (rc == 0 && c.p != c.end && !rest_ok) rc = -1;
    }
    PyObject *out = NULL;
    if (rc == 0) {
        /* (records, instant spans, new names, new categories, new strings, new shapes, instants, end) */
        PyObject *items[6] = {buf_take(&recs), buf_take(&instants), table_new_entries(&self->names, n0),
                              table_new_entries(&self->cats, c0), table_new_entries(&self->strs, s0),
                              table_new_entries(&self->shapes, h0)};
        int ok = 1;
        for (int i = 0; i < 6; i++) ok &= items[i] != NULL;
        PyObject *n_i = ok ? PyLong_FromSsize_t(n_instants) : NULL;
        PyObject *end = n_i ? PyLong_FromSsize_t((Py_ssize_t)(c.p - base)) : NULL;
        out = end ? PyTuple_New(8) : NULL;
        if (out) {
            for (int i = 0; i < 6; i++) PyTuple_SET_ITEM(out, i, items[i]);
            PyTuple_SET_ITEM(out, 6, n_i);
            PyTuple_SET_ITEM(out, 7, end);
        } else {
            for (int i = 0; i < 6; i++) Py_XDECREF(items[i]);
            Py_XDECREF(n_i);
            Py_XDECREF(end);
        }
    }
    Py_XDECREF(recs.obj);
    Py_XDECREF(instants.obj);
    PyBuffer_Release(&view);
    if (!out) {
        table_rollback(&self->names, n0);
        table_rollback(&self->cats, c0);
        table_rollback(&self->strs, s0);
        table_rollback(&self->shapes, h0);
        if (rc == -2) return PyErr_NoMemory();
        if (rc == 0) return NULL; /* an exception from building the result */
        Py_RETURN_NONE;
    }
    return out;
}

static int Scanner_init(Scanner *self, PyObject *args, PyObject *kwds) {
    unsigned long long seed = 0x243F6A8885A308D3ULL;
    static char *kwlist[] = {"seed", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|K", kwlist, &seed)) return -1;
    self->names.seed = seed;
    self->cats.seed = seed * 3 + 1;
    self->strs.seed = seed * 5 + 2;
    self->shapes.seed = seed * 7 + 3;
    return 0;
}

static PyObject *Scanner_rollback(Scanner *self, PyObject *args) {
    Py_ssize_t n, c, s, h;
    if (!PyArg_ParseTuple(args, "nnnn", &n, &c, &s, &h)) return NULL;
    table_rollback(&self->names, n);
    table_rollback(&self->cats, c);
    table_rollback(&self->strs, s);
    table_rollback(&self->shapes, h);
    Py_RETURN_NONE;
}

static void Scanner_dealloc(Scanner *self) {
    table_free(&self->names);
    table_free(&self->cats);
    table_free(&self->strs);
    table_free(&self->shapes);
    PyMem_Free(self->key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Scanner_methods[] = {
    {"scan", (PyCFunction)Scanner_scan, METH_VARARGS,
     "scan(buf, exact, rest_ok=False) -> (records, instant spans, new names, new cats, new strings, "
     "new shapes, instants, end of the array) or None"},
    {"rollback", (PyCFunction)Scanner_rollback, METH_VARARGS, "rollback(n_names, n_cats, n_strings, n_shapes)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "torchdoctor.trace._scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(seed=...): scans Kineto event arrays into records; string tables persist across calls "
              "(one file). Give it a random seed: the tables' hash is keyed by it.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_methods = Scanner_methods,
};

static struct PyModuleDef scan_module = {
    PyModuleDef_HEAD_INIT, "_scan", "Strict scanner of Kineto event arrays (see decode.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__scan(void) {
    index_arg_keys();
    if (PyType_Ready(&ScannerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&scan_module);
    if (!m) return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "RECORD_BYTES", (long)sizeof(Rec)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
