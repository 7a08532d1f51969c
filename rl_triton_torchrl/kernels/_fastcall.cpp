/* A recorded kernels-API call replayed in one C++ function (built and loaded by _fastcall.py).

   remember(fn, args, kwargs, entry) keeps the facts of a call whose signature (_replay.signature) found `entry`, an
   _replay.Entry with a FastEntry: every tensor argument's shape, strides, dtype, device, requires_grad and the low
   four bits of its data pointer, read through ATen; every other argument's type and value (a float zero's sign
   too); the keyword names in order; the global state _replay._state reads (the grad mode, the backend variable as
   os.environ holds it, scan's launch-constant epoch and the deterministic flag). Those are exactly what the
   signature keys, so a call with the same facts has the same signature, and the same entry.

   call(fn, args, kwargs) compares a call's facts with those remembered for fn (the last RING signatures) and, where
   they match, makes the whole call here: the launcher's settings compared, the outputs allocated (at::empty_like of
   the entry's `like`), every pointer written into the entry's own parameter buffer, cuLaunchKernel called on the
   current stream. It returns the call's result, or None for a call it did not make (no facts match, a recording
   running, anything declined or failed here: nothing was launched then), which _replay's Python path makes.
   The GIL is held throughout: no other thread writes an entry's buffer between its writes and the driver's copy. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

/* cuLaunchKernel, with the driver's handles as pointers */
using launch_fn = int (*)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shared, void *stream, void **params, void **extra);

constexpr Py_ssize_t MAX_POINTERS = 64; /* per-call pointers of one launch: its tensor arguments' and outputs' */
constexpr Py_ssize_t MAX_OUTPUTS = 16, MAX_BUFFERS = 16, MAX_ARGS = 32, MAX_DIMS = 8;
constexpr int RING = 8; /* signatures remembered per function */

PyObject *s_recordings, *s_poison, *s_epoch, *s_environ;
/* set by configure(): _replay._local, the scan module, Entry's index of its FastEntry, the os module, os.environ
   and its _data dict (None where it has none), the backend variable's key in it */
PyObject *local_obj, *scan_module, *os_module, *environ_obj, *environ_data, *env_key;
Py_ssize_t fast_index = -1;
unsigned long long hits;

struct Source {
    Py_ssize_t arg;
    long long offset;
};

struct FastEntry {
    PyObject_HEAD
    launch_fn launch;
    void *function;
    unsigned grid[3], block, shared;
    char *buffer;  /* the parameters: per-call pointers first, 8 bytes each, then the rest as prepared */
    void **params; /* one pointer into buffer per kernel parameter */
    Py_ssize_t n_head, n_outputs, n_tail;
    Source *sources; /* n_head, then n_tail */
    Py_ssize_t buffer_slot, final_at; /* the slot of the first buffer's pointer; the final state among them, or -1 */
    PyObject *like, *settings_fn, *settings, *stream_fn, *device, *result, *makers, *state_shape;
};

PyTypeObject FastEntryType = {PyVarObject_HEAD_INIT(nullptr, 0)};

/* One tensor argument's facts, as the signature keys them. */
struct TensorFacts {
    int64_t ndim;
    int64_t sizes[MAX_DIMS], strides[MAX_DIMS];
    int dtype, device_type, device_index;
    bool requires_grad;
    unsigned low;

    bool operator==(const TensorFacts &o) const {
        return ndim == o.ndim && dtype == o.dtype && device_type == o.device_type &&
               device_index == o.device_index && requires_grad == o.requires_grad && low == o.low &&
               std::memcmp(sizes, o.sizes, ndim * sizeof(int64_t)) == 0 &&
               std::memcmp(strides, o.strides, ndim * sizeof(int64_t)) == 0;
    }
};

/* Whether v is a torch.Tensor, not a subclass (nor a Parameter, which THPVariable_CheckExact admits): the tensors
   the signature keys. */
bool exact_tensor(PyObject *v) { return Py_TYPE(v) == reinterpret_cast<PyTypeObject *>(THPVariableClass); }

/* An exact torch.Tensor's facts and data pointer; false for one the signature would not key (no storage, as under
   torch.compile; another layout; more dimensions than kept here), as for any error. */
bool tensor_facts(PyObject *o, TensorFacts &f, uint64_t &ptr) {
    try {
        const at::Tensor &t = THPVariable_Unpack(o);
        if (t.layout() != c10::kStrided || !t.has_storage() || t.dim() > MAX_DIMS)
            return false;
        f.ndim = t.dim();
        auto sizes = t.sizes();
        auto strides = t.strides();
        for (int64_t i = 0; i < f.ndim; i++)
            f.sizes[i] = sizes[i], f.strides[i] = strides[i];
        f.dtype = static_cast<int>(t.scalar_type());
        f.device_type = static_cast<int>(t.device().type());
        f.device_index = t.device().index();
        f.requires_grad = t.requires_grad();
        ptr = reinterpret_cast<uint64_t>(t.data_ptr());
        f.low = ptr & 15;
        return true;
    } catch (...) {
        return false;
    }
}

/* Whether the signature keys a non-tensor argument (its (type, value) part): exact float, int, bool, str, None. */
bool keyed_scalar(PyObject *v) {
    return PyFloat_CheckExact(v) || PyLong_CheckExact(v) || PyBool_Check(v) || PyUnicode_CheckExact(v) ||
           v == Py_None;
}

/* Whether two keyed scalars key alike: the same type and equal values, and a float zero's sign (0.0 == -0.0); the
   same object always (a NaN too, as a tuple comparison finds it). */
bool same_scalar(PyObject *a, PyObject *b) {
    if (a == b)
        return true;
    if (Py_TYPE(a) != Py_TYPE(b))
        return false;
    if (PyFloat_CheckExact(a)) {
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
        return x == y && (x != 0.0 || std::signbit(x) == std::signbit(y));
    }
    int same = PyObject_RichCompareBool(a, b, Py_EQ);
    if (same < 0)
        PyErr_Clear();
    return same == 1;
}

/* The global state a call reads besides its arguments (_replay._state). */
struct State {
    bool grad, deterministic;
    long long epoch;
    PyObject *env; /* borrowed from os.environ's dict: the backend variable's value, or nullptr where unset */
};

/* This moment's state; false where it cannot be read here (os.environ replaced, say): the call is not made here. */
bool read_state(State &s) {
    s.grad = c10::GradMode::is_enabled();
    s.deterministic = at::globalContext().deterministicAlgorithms();
    PyObject *epoch = PyObject_GetAttr(scan_module, s_epoch);
    if (!epoch) {
        PyErr_Clear();
        return false;
    }
    s.epoch = PyLong_AsLongLong(epoch);
    Py_DECREF(epoch);
    PyObject *environ = PyObject_GetAttr(os_module, s_environ);
    if (!environ || PyErr_Occurred()) {
        Py_XDECREF(environ);
        PyErr_Clear();
        return false;
    }
    bool same = environ == environ_obj;
    Py_DECREF(environ);
    if (!same || !PyDict_Check(environ_data))
        return false;
    s.env = PyDict_GetItemWithError(environ_data, env_key);
    if (!s.env && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
    }
    return true;
}

struct ArgFacts {
    PyObject *scalar; /* a keyed scalar, or nullptr for a tensor */
    TensorFacts tensor;
};

/* A call's facts: everything its signature keys but the function. The references are borrowed from the call in a
   call's facts, and held by a Memo (take / release). */
struct CallFacts {
    Py_ssize_t n_args = 0, n = 0, n_ptrs = 0;
    PyObject *names[MAX_ARGS];   /* the keyword names, in order: n - n_args of them */
    ArgFacts args[MAX_ARGS];     /* the positional arguments, then the keyword ones */
    uint64_t ptrs[MAX_ARGS];     /* the tensor arguments' data pointers, in order */
    State state;
};

/* A call's facts (with this moment's state); false for a call the signature does not key (or more arguments than
   kept here), or where the state cannot be read here. */
bool read_call(PyObject *args, PyObject *kwargs, CallFacts &c) {
    c.n_args = PyTuple_GET_SIZE(args);
    c.n = c.n_args + PyDict_GET_SIZE(kwargs);
    c.n_ptrs = 0;
    if (c.n > MAX_ARGS || !read_state(c.state))
        return false;
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < c.n; i++) {
        PyObject *v;
        if (i < c.n_args)
            v = PyTuple_GET_ITEM(args, i);
        else
            PyDict_Next(kwargs, &pos, &c.names[i - c.n_args], &v);
        ArgFacts &f = c.args[i];
        if (exact_tensor(v)) {
            f.scalar = nullptr;
            if (!tensor_facts(v, f.tensor, c.ptrs[c.n_ptrs++]))
                return false;
        } else if (keyed_scalar(v)) {
            f.scalar = v;
        } else {
            return false;
        }
    }
    return true;
}

/* Whether two calls' facts are the same: whether their signatures are. */
bool same_call(const CallFacts &a, const CallFacts &b) {
    const State &s = a.state, &t = b.state;
    if (a.n != b.n || a.n_args != b.n_args || s.grad != t.grad || s.deterministic != t.deterministic ||
        s.epoch != t.epoch || (s.env == nullptr) != (t.env == nullptr) || (s.env && !same_scalar(s.env, t.env)))
        return false;
    for (Py_ssize_t i = 0; i < a.n - a.n_args; i++)
        if (!same_scalar(a.names[i], b.names[i]))
            return false;
    for (Py_ssize_t i = 0; i < a.n; i++) {
        const ArgFacts &x = a.args[i], &y = b.args[i];
        if ((x.scalar == nullptr) != (y.scalar == nullptr) ||
            (x.scalar ? !same_scalar(x.scalar, y.scalar) : !(x.tensor == y.tensor)))
            return false;
    }
    return true;
}

/* A remembered call: its facts (their references held) and the entry its signature found. */
struct Memo {
    PyObject *entry = nullptr;
    CallFacts facts;

    void take(const CallFacts &c, PyObject *e) {
        release();
        facts = c;
        for (Py_ssize_t i = 0; i < c.n; i++)
            Py_XINCREF(c.args[i].scalar);
        for (Py_ssize_t i = 0; i < c.n - c.n_args; i++)
            Py_INCREF(c.names[i]);
        Py_XINCREF(c.state.env);
        entry = Py_NewRef(e);
    }

    void release() {
        if (!entry)
            return;
        for (Py_ssize_t i = 0; i < facts.n; i++)
            Py_XDECREF(facts.args[i].scalar);
        for (Py_ssize_t i = 0; i < facts.n - facts.n_args; i++)
            Py_DECREF(facts.names[i]);
        Py_XDECREF(facts.state.env);
        Py_CLEAR(entry);
    }
};

struct Memos {
    PyObject *fn; /* a strong reference */
    Memo ring[RING];
    int next = 0;
};

std::vector<Memos *> memos; /* one per function seen: a handful */

Memos *memos_of(PyObject *fn) {
    for (Memos *m : memos)
        if (m->fn == fn)
            return m;
    return nullptr;
}

/* The memo of a call of fn with the facts c, or nullptr. */
Memo *find(Memos *ms, const CallFacts &c) {
    if (ms)
        for (Memo &m : ms->ring)
            if (m.entry && same_call(m.facts, c))
                return &m;
    return nullptr;
}

uint64_t as_pointer(PyObject *v) {
    unsigned long long p = PyLong_AsUnsignedLongLong(v);
    return p == (unsigned long long)-1 && PyErr_Occurred() ? 0 : p;
}

/* Whether a call of this thread is being recorded (_replay.recording()); -1 on an error. */
int recording() {
    PyObject *stack = PyObject_GetAttr(local_obj, s_recordings);
    if (!stack)
        return -1;
    int busy = PyObject_IsTrue(stack);
    Py_DECREF(stack);
    return busy;
}

/* The call made by e with the tensor arguments' pointers ptrs, or nullptr (an error set or not): nothing launched
   then, the caller makes the call. */
PyObject *replay(FastEntry *e, const uint64_t *ptrs, Py_ssize_t n_ptrs) {
    PyObject *poison = PyObject_GetAttr(scan_module, s_poison);
    if (!poison)
        return nullptr;
    int poisoned = PyObject_IsTrue(poison); /* outputs filled with NaN before the launch, as scan.new_outputs does */
    Py_DECREF(poison);
    if (poisoned < 0)
        return nullptr;
    PyObject *now = PyObject_CallNoArgs(e->settings_fn);
    if (!now)
        return nullptr;
    int same = PyObject_RichCompareBool(now, e->settings, Py_EQ);
    Py_DECREF(now);
    if (same != 1)
        return nullptr;
    /* the per-call pointers, written into the entry's buffer only right before the launch, with no Python call in
       between: no other thread can run (and write the same buffer) between the writes and the driver's copy */
    uint64_t values[MAX_POINTERS], buffers[MAX_BUFFERS];
    for (Py_ssize_t i = 0; i < e->n_head + e->n_tail; i++) {
        Source s = e->sources[i];
        if (s.arg >= n_ptrs)
            return nullptr;
        values[i < e->n_head ? i : i + e->n_outputs] = ptrs[s.arg] + (uint64_t)s.offset;
    }
    Py_ssize_t n_outputs = e->n_outputs, n_buffers = PyTuple_GET_SIZE(e->makers);
    at::Tensor outputs[MAX_OUTPUTS];
    PyObject *held[MAX_BUFFERS]; /* the buffers, alive until launched (the final state returned) */
    Py_ssize_t made = 0;
    PyObject *result = nullptr, *wrapped[MAX_OUTPUTS] = {};
    try {
        const at::Tensor &like = THPVariable_Unpack(e->like);
        for (Py_ssize_t i = 0; i < n_outputs; i++) {
            outputs[i] = at::empty_like(like);
            if (poisoned)
                outputs[i].fill_(NAN);
            values[e->n_head + i] = reinterpret_cast<uint64_t>(outputs[i].data_ptr());
        }
    } catch (...) {
        return nullptr; /* (an allocation that failed: the caller's call raises it) */
    }
    for (; made < n_buffers; made++) {
        PyObject *t = PyObject_CallNoArgs(PyTuple_GET_ITEM(e->makers, made));
        if (!t)
            goto fail;
        held[made] = t;
        TensorFacts unused;
        uint64_t ptr;
        if (!THPVariable_Check(t) || !tensor_facts(t, unused, ptr) || (ptr & 15)) {
            made++;
            goto fail; /* (a misaligned buffer: the caller's launch finds it misaligned too, and launches plainly) */
        }
        buffers[made] = ptr;
    }
    {
        PyObject *stream = PyObject_CallOneArg(e->stream_fn, e->device);
        if (!stream)
            goto fail;
        uint64_t handle = as_pointer(stream);
        Py_DECREF(stream);
        if (PyErr_Occurred())
            goto fail;
        std::memcpy(e->buffer, values, (e->n_head + n_outputs + e->n_tail) * sizeof(uint64_t));
        std::memcpy(e->buffer + e->buffer_slot * 8, buffers, n_buffers * sizeof(uint64_t));
        if (e->launch(e->function, e->grid[0], e->grid[1], e->grid[2], e->block, 1, 1, e->shared,
                      reinterpret_cast<void *>(handle), e->params, nullptr))
            goto fail; /* not launched: the caller's launch reports the driver's error */
    }
    {
        PyObject *final = nullptr;
        if (e->final_at >= 0) {
            final = PyObject_CallMethod(held[e->final_at], "reshape", "(O)", e->state_shape);
            if (!final)
                goto fail;
        }
        for (Py_ssize_t i = 0; i < n_outputs; i++) {
            wrapped[i] = THPVariable_Wrap(std::move(outputs[i]));
            if (!wrapped[i]) {
                Py_XDECREF(final);
                goto fail;
            }
        }
        int single = PyLong_Check(e->result);
        Py_ssize_t n = single ? 1 : PyTuple_GET_SIZE(e->result);
        result = single ? nullptr : PyTuple_New(n);
        if (!single && !result) {
            Py_XDECREF(final);
            goto fail;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t r = PyLong_AsSsize_t(single ? e->result : PyTuple_GET_ITEM(e->result, i));
            PyObject *item = Py_NewRef(r < 0 ? final : wrapped[r]);
            if (single)
                result = item;
            else
                PyTuple_SET_ITEM(result, i, item);
        }
        Py_XDECREF(final);
    }
    for (Py_ssize_t i = 0; i < n_outputs; i++)
        Py_XDECREF(wrapped[i]);
    for (Py_ssize_t i = 0; i < made; i++)
        Py_DECREF(held[i]);
    hits++;
    return result;
fail:
    for (Py_ssize_t i = 0; i < n_outputs; i++)
        Py_XDECREF(wrapped[i]);
    for (Py_ssize_t i = 0; i < made; i++)
        Py_XDECREF(held[i]);
    return nullptr;
}

/* The FastEntry of an _replay.Entry (a borrowed reference), or nullptr. */
FastEntry *fast_of(PyObject *entry) {
    if (!PyTuple_Check(entry) || fast_index < 0 || PyTuple_GET_SIZE(entry) <= fast_index)
        return nullptr;
    PyObject *fast = PyTuple_GET_ITEM(entry, fast_index);
    return Py_TYPE(fast) == &FastEntryType ? reinterpret_cast<FastEntry *>(fast) : nullptr;
}

bool check_call_args(PyObject *const *a, Py_ssize_t n, Py_ssize_t want, const char *usage) {
    if (n != want || !PyTuple_Check(a[1]) || !PyDict_Check(a[2])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return false;
    }
    if (!local_obj) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return false;
    }
    return true;
}

PyObject *fc_call(PyObject *, PyObject *const *a, Py_ssize_t n) {
    if (!check_call_args(a, n, 3, "call(fn, args: tuple, kwargs: dict)"))
        return nullptr;
    Memos *ms = memos_of(a[0]);
    CallFacts c;
    Memo *m = ms && read_call(a[1], a[2], c) ? find(ms, c) : nullptr;
    FastEntry *fast = m ? fast_of(m->entry) : nullptr;
    if (!fast || recording() != 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *entry = Py_NewRef(m->entry); /* (alive while replayed, whatever remember() does meanwhile) */
    PyObject *result = replay(fast, c.ptrs, c.n_ptrs);
    Py_DECREF(entry);
    if (!result) {
        PyErr_Clear(); /* declined or failed: the caller's replay of the entry runs the call (and raises) */
        Py_RETURN_NONE;
    }
    return result;
}

/* remember(fn, args, kwargs, entry): the call's facts, for the calls of fn with the same ones. */
PyObject *fc_remember(PyObject *, PyObject *const *a, Py_ssize_t n) {
    if (!check_call_args(a, n, 4, "remember(fn, args: tuple, kwargs: dict, entry)"))
        return nullptr;
    CallFacts c;
    if (!fast_of(a[3]) || !read_call(a[1], a[2], c)) {
        PyErr_Clear();
        Py_RETURN_FALSE; /* a call the signature does not key */
    }
    Memos *ms = memos_of(a[0]);
    if (!ms) {
        ms = new Memos();
        ms->fn = Py_NewRef(a[0]);
        memos.push_back(ms);
    }
    Memo *slot = find(ms, c); /* the same facts again (a call made in Python meanwhile): its entry is the newer */
    if (!slot) {
        slot = &ms->ring[ms->next];
        ms->next = (ms->next + 1) % RING;
    }
    slot->take(c, a[3]);
    Py_RETURN_TRUE;
}

/* lookup(fn, args, kwargs) -> the entry remembered for a call with these facts, or None (what call() would make) */
PyObject *fc_lookup(PyObject *, PyObject *const *a, Py_ssize_t n) {
    if (!check_call_args(a, n, 3, "lookup(fn, args: tuple, kwargs: dict)"))
        return nullptr;
    CallFacts c;
    Memos *ms = memos_of(a[0]);
    Memo *m = ms && read_call(a[1], a[2], c) ? find(ms, c) : nullptr;
    PyErr_Clear();
    return Py_NewRef(m ? m->entry : Py_None);
}

PyObject *fc_forget(PyObject *, PyObject *) {
    for (Memos *ms : memos) {
        for (Memo &m : ms->ring)
            m.release();
        Py_DECREF(ms->fn);
        delete ms;
    }
    memos.clear();
    Py_RETURN_NONE;
}

PyObject *fc_configure(PyObject *, PyObject *args) {
    PyObject *local, *scan, *os, *environ, *data, *key;
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "OOnOOOO", &local, &scan, &index, &os, &environ, &data, &key))
        return nullptr;
    Py_XSETREF(local_obj, Py_NewRef(local));
    Py_XSETREF(scan_module, Py_NewRef(scan));
    Py_XSETREF(os_module, Py_NewRef(os));
    Py_XSETREF(environ_obj, Py_NewRef(environ));
    Py_XSETREF(environ_data, Py_NewRef(data));
    Py_XSETREF(env_key, Py_NewRef(key));
    fast_index = index;
    Py_RETURN_NONE;
}

PyObject *fc_hits(PyObject *, PyObject *) { return PyLong_FromUnsignedLongLong(hits); }

int read_sources(PyObject *seq, Source *out) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(seq); i++) {
        PyObject *pair = PyTuple_GET_ITEM(seq, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "a source is an (argument, byte offset) pair");
            return -1;
        }
        out[i].arg = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
        out[i].offset = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
        if (PyErr_Occurred())
            return -1;
        if (out[i].arg < 0 || out[i].arg >= MAX_ARGS) {
            PyErr_SetString(PyExc_ValueError, "a source's argument is out of range");
            return -1;
        }
    }
    return 0;
}

void fast_entry_dealloc(PyObject *o) {
    FastEntry *self = reinterpret_cast<FastEntry *>(o);
    PyMem_Free(self->buffer);
    PyMem_Free(self->params);
    PyMem_Free(self->sources);
    Py_XDECREF(self->like);
    Py_XDECREF(self->settings_fn);
    Py_XDECREF(self->settings);
    Py_XDECREF(self->stream_fn);
    Py_XDECREF(self->device);
    Py_XDECREF(self->result);
    Py_XDECREF(self->makers);
    Py_XDECREF(self->state_shape);
    Py_TYPE(o)->tp_free(o);
}

/* FastEntry(launch, function, grid, block, shared, buffer, param_offsets, head, n_outputs, tail, like, settings_fn,
             settings, stream_fn, device, result, makers, buffer_slot, final_at, state_shape)
   launch: the address of cuLaunchKernel (or of a function of its type); buffer: bytes, the prepared parameters with
   the numbers in place; param_offsets: each parameter's byte offset in it; head / tail: (argument, byte offset) of
   each pointer before / after the outputs'; like: the tensor each output is allocated like (at::empty_like);
   result: an output's index (-1: the final state), or a tuple of them; makers: a function per buffer allocated per
   call (_LaunchPlan.buffers), whose pointers go from slot buffer_slot on; final_at: the final state's index among
   them (-1: none), returned reshaped to state_shape. */
PyObject *fast_entry_new(PyTypeObject *type, PyObject *args, PyObject *) {
    unsigned long long launch, function;
    unsigned gx, gy, gz, block, shared;
    Py_ssize_t n_outputs, buffer_slot, final_at;
    PyObject *buffer, *offsets, *head, *tail, *like, *settings_fn, *settings, *stream_fn, *device, *result, *makers,
        *state_shape;
    if (!PyArg_ParseTuple(args, "KK(III)IIO!O!O!nO!OOOOOOO!nnO", &launch, &function, &gx, &gy, &gz, &block, &shared,
                          &PyBytes_Type, &buffer, &PyTuple_Type, &offsets, &PyTuple_Type, &head, &n_outputs,
                          &PyTuple_Type, &tail, &like, &settings_fn, &settings, &stream_fn, &device, &result,
                          &PyTuple_Type, &makers, &buffer_slot, &final_at, &state_shape))
        return nullptr;
    Py_ssize_t n_ptrs = PyTuple_GET_SIZE(head) + n_outputs + PyTuple_GET_SIZE(tail);
    Py_ssize_t size = PyBytes_GET_SIZE(buffer), n_makers = PyTuple_GET_SIZE(makers);
    if (!launch || n_outputs < 0 || n_ptrs * 8 > size || buffer_slot < n_ptrs || (buffer_slot + n_makers) * 8 > size ||
        final_at >= n_makers || n_makers > MAX_BUFFERS || n_ptrs > MAX_POINTERS || n_outputs > MAX_OUTPUTS ||
        !THPVariable_Check(like)) {
        PyErr_SetString(PyExc_ValueError, "no launch function, a `like` that is no tensor, or more pointers, outputs "
                                          "or buffers than the buffer (or this module) holds");
        return nullptr;
    }
    FastEntry *self = reinterpret_cast<FastEntry *>(type->tp_alloc(type, 0));
    if (!self)
        return nullptr;
    self->launch = reinterpret_cast<launch_fn>(static_cast<uintptr_t>(launch));
    self->function = reinterpret_cast<void *>(static_cast<uintptr_t>(function));
    self->grid[0] = gx, self->grid[1] = gy, self->grid[2] = gz;
    self->block = block, self->shared = shared;
    self->n_head = PyTuple_GET_SIZE(head), self->n_outputs = n_outputs, self->n_tail = PyTuple_GET_SIZE(tail);
    Py_ssize_t n_params = PyTuple_GET_SIZE(offsets);
    self->buffer = static_cast<char *>(PyMem_Malloc(size ? size : 1));
    self->params = static_cast<void **>(PyMem_Malloc((n_params ? n_params : 1) * sizeof(void *)));
    self->sources = static_cast<Source *>(PyMem_Malloc((self->n_head + self->n_tail + 1) * sizeof(Source)));
    self->like = Py_NewRef(like), self->settings_fn = Py_NewRef(settings_fn), self->settings = Py_NewRef(settings);
    self->stream_fn = Py_NewRef(stream_fn), self->device = Py_NewRef(device), self->result = Py_NewRef(result);
    self->makers = Py_NewRef(makers), self->state_shape = Py_NewRef(state_shape);
    self->buffer_slot = buffer_slot, self->final_at = final_at < 0 ? -1 : final_at;
    if (!self->buffer || !self->params || !self->sources) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    std::memcpy(self->buffer, PyBytes_AS_STRING(buffer), size);
    for (Py_ssize_t i = 0; i < n_params; i++) {
        Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GET_ITEM(offsets, i));
        if (off < 0 || off + 8 > size) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a parameter offset outside the buffer");
            Py_DECREF(self);
            return nullptr;
        }
        self->params[i] = self->buffer + off;
    }
    if (read_sources(head, self->sources) || read_sources(tail, self->sources + self->n_head)) {
        Py_DECREF(self);
        return nullptr;
    }
    int single = PyLong_Check(result);
    Py_ssize_t n_results = single ? 1 : PyTuple_Check(result) ? PyTuple_GET_SIZE(result) : -1;
    for (Py_ssize_t i = 0; i < n_results; i++) {
        Py_ssize_t r = PyLong_AsSsize_t(single ? result : PyTuple_GET_ITEM(result, i));
        if (r < (final_at < 0 ? 0 : -1) || r >= n_outputs) {
            n_results = -1;
            break;
        }
    }
    if (n_results < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "the result is an output's index (-1: the final state) or a tuple of them");
        Py_DECREF(self);
        return nullptr;
    }
    return reinterpret_cast<PyObject *>(self);
}

PyMethodDef methods[] = {
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fc_call)), METH_FASTCALL,
     "call(fn, args, kwargs) -> the call's result, made here, or None"},
    {"remember", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fc_remember)), METH_FASTCALL,
     "remember(fn, args, kwargs, entry) -> whether the call's facts were kept"},
    {"lookup", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fc_lookup)), METH_FASTCALL,
     "lookup(fn, args, kwargs) -> the entry remembered for a call with these facts, or None"},
    {"forget", fc_forget, METH_NOARGS, "Forgets every remembered call."},
    {"configure", fc_configure, METH_VARARGS,
     "configure(_replay._local, the scan module, Entry's index of its FastEntry, os, os.environ, its _data dict "
     "(None without one), the backend variable's key in it)"},
    {"hits", fc_hits, METH_NOARGS, "The calls made here so far."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcall_ext", nullptr, -1, methods};

} // namespace

PyMODINIT_FUNC PyInit__fastcall_ext(void) {
    FastEntryType.tp_name = "_fastcall_ext.FastEntry";
    FastEntryType.tp_basicsize = sizeof(FastEntry);
    FastEntryType.tp_flags = Py_TPFLAGS_DEFAULT;
    FastEntryType.tp_doc = "A recorded call's launch, replayed by call().";
    FastEntryType.tp_new = fast_entry_new;
    FastEntryType.tp_dealloc = fast_entry_dealloc;
    if (PyType_Ready(&FastEntryType) < 0)
        return nullptr;
    s_recordings = PyUnicode_InternFromString("recordings");
    s_poison = PyUnicode_InternFromString("POISON_OUTPUTS");
    s_epoch = PyUnicode_InternFromString("_CONFIG_EPOCH");
    s_environ = PyUnicode_InternFromString("environ");
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return nullptr;
    if (PyModule_AddObjectRef(m, "FastEntry", reinterpret_cast<PyObject *>(&FastEntryType)) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
