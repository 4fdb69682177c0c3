/*
 * _lstatcmp: compare a directory's files with their stat cache record in one call.
 *
 * Why native: a re-hash of unchanged data is one lstat per file and nothing else
 * (core/data/hashing/treehash.py).  In Python each os.lstat also parses arguments and builds an
 * os.stat_result, which costs about as much as the system call itself; this loop
 * makes only the system calls, with the GIL released, and compares the results with
 * the record's arrays in place.  Optional: the package falls back to the same
 * comparison in Python when this module was not built (core/data/hashing/fastlstat.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__APPLE__)
#define MTIM st_mtimespec
#define CTIM st_ctimespec
#else
#define MTIM st_mtim
#define CTIM st_ctim
#endif

/* One file's recorded signature vs. its lstat now: 1 equal, 0 not. */
static int
same_sig(const struct stat *st, const char *inodes, const char *numbers, Py_ssize_t i)
{
    uint64_t ino;
    int64_t want[3];
    memcpy(&ino, inodes + 8 * i, 8); /* buffers may be unaligned views */
    memcpy(want, numbers + 24 * i, 24);
    int64_t mtime = (int64_t)st->MTIM.tv_sec * 1000000000LL + st->MTIM.tv_nsec;
    int64_t ctime = (int64_t)st->CTIM.tv_sec * 1000000000LL + st->CTIM.tv_nsec;
    return (uint64_t)st->st_ino == ino && (int64_t)st->st_size == want[0] && mtime == want[1]
           && ctime == want[2];
}

PyDoc_STRVAR(compare_doc,
"compare(dir_fd, names, inodes, numbers, start) -> int\n\n"
"lstat each of ``names`` (bytes, relative to ``dir_fd``, links not followed) and\n"
"compare (inode, size, mtime_ns, ctime_ns) with the record: ``inodes`` (u64) and\n"
"``numbers`` (i64 size, mtime_ns, ctime_ns per file), from index ``start``.\n"
"Returns 1 when every file is equal, 0 when one differs, -1 when one is gone.");

static PyObject *
compare(PyObject *self, PyObject *args)
{
    (void)self;
    int fd;
    PyObject *names, *seq;
    Py_buffer inodes, numbers;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "iOy*y*n", &fd, &names, &inodes, &numbers, &start))
        return NULL;
    /* A tuple holds references to the names while the GIL is released. */
    seq = PySequence_Tuple(names);
    const char **ptrs = NULL;
    long result = 1;
    if (seq == NULL)
        goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    if (start < 0 || inodes.len / 8 < start + n || numbers.len / 24 < start + n) {
        PyErr_SetString(PyExc_ValueError, "record arrays are shorter than the names");
        goto done;
    }
    ptrs = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(char *));
    if (ptrs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "names must be bytes");
            goto done;
        }
        ptrs[i] = PyBytes_AS_STRING(item);
        if ((Py_ssize_t)strlen(ptrs[i]) != PyBytes_GET_SIZE(item)) {
            PyErr_SetString(PyExc_ValueError, "a name contains a NUL byte");
            goto done;
        }
    }
    const char *ino = (const char *)inodes.buf + 8 * start;
    const char *num = (const char *)numbers.buf + 24 * start;
    Py_BEGIN_ALLOW_THREADS
    struct stat st;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (fstatat(fd, ptrs[i], &st, AT_SYMLINK_NOFOLLOW) != 0) {
            result = -1;
            break;
        }
        if (!same_sig(&st, ino, num, i)) {
            result = 0;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(ptrs);
    Py_DECREF(seq);
    PyBuffer_Release(&inodes);
    PyBuffer_Release(&numbers);
    return PyLong_FromLong(result);
done:
    PyMem_Free(ptrs);
    Py_XDECREF(seq);
    PyBuffer_Release(&inodes);
    PyBuffer_Release(&numbers);
    return NULL;
}

static PyMethodDef methods[] = {
    {"compare", compare, METH_VARARGS, compare_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_lstatcmp",
    "Native comparison of a directory's lstat results with its stat cache record.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__lstatcmp(void)
{
    return PyModule_Create(&module);
}
