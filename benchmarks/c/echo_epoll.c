/* An echo server in C with no interpreter: the floor the network benchmarks' servers
 * are measured against (what the kernel alone costs a request on this machine).
 *
 *   echo_epoll [host:port]     prints "LISTEN <host>:<port>", then echoes
 *
 * One thread, non-blocking sockets, level-triggered epoll: for each ready connection
 * one recv of what is there and one send of it back. The bytes are echoed as they
 * come, so every frame (4-byte length and payload) comes back whole without being
 * parsed: a frame-aware echo costs the same system calls and a few nanoseconds more.
 * A send the socket cannot take whole keeps the rest and stops reading that
 * connection until it is written (the client's pipelined load needs this). Listens on
 * the address given (127.0.0.1:0 by default). Built by benchmarks/procs.py (c_build).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHUNK 65536
#define MAX_EVENTS 256

struct conn {
    int fd;
    char *pending; /* bytes read but not yet sent back */
    size_t npending;
    size_t cap;
};

static int epfd;

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void drop(struct conn *c) {
    close(c->fd); /* also leaves the epoll set */
    free(c->pending);
    free(c);
}

/* Send what is pending; 0 when all of it went, 1 when some is left, -1 on error. */
static int flush_pending(struct conn *c) {
    size_t off = 0;
    while (off < c->npending) {
        ssize_t n = send(c->fd, c->pending + off, c->npending - off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) break;
            return -1;
        }
        off += (size_t)n;
    }
    memmove(c->pending, c->pending + off, c->npending - off);
    c->npending -= off;
    return c->npending > 0;
}

static int watch(struct conn *c, unsigned events, int op) {
    struct epoll_event ev = {.events = events, .data.ptr = c};
    return epoll_ctl(epfd, op, c->fd, &ev);
}

static void on_ready(struct conn *c, unsigned events) {
    if (c->npending > 0) { /* waiting to write: only EPOLLOUT is watched */
        int left = flush_pending(c);
        if (left < 0 || (events & (EPOLLHUP | EPOLLERR))) {
            drop(c);
        } else if (left == 0 && watch(c, EPOLLIN, EPOLL_CTL_MOD) < 0) {
            die("epoll_ctl");
        }
        return;
    }
    char buf[CHUNK];
    ssize_t n = recv(c->fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        drop(c);
        return;
    }
    if (n < 0) return;
    ssize_t sent = send(c->fd, buf, (size_t)n, MSG_NOSIGNAL);
    if (sent < 0) {
        if (errno != EAGAIN && errno != EINTR) {
            drop(c);
            return;
        }
        sent = 0;
    }
    if (sent < n) { /* keep the rest; read no more until it is written */
        size_t rest = (size_t)(n - sent);
        if (c->cap < rest) {
            char *grown = realloc(c->pending, rest);
            if (grown == NULL) die("realloc");
            c->pending = grown;
            c->cap = rest;
        }
        memcpy(c->pending, buf + sent, rest);
        c->npending = rest;
        if (watch(c, EPOLLOUT, EPOLL_CTL_MOD) < 0) die("epoll_ctl");
    }
}

int main(int argc, char **argv) {
    const char *addr = argc > 1 ? argv[1] : "127.0.0.1:0";
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || (size_t)(colon - addr) >= sizeof host) {
        fprintf(stderr, "usage: echo_epoll [host:port]\n");
        return 2;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "echo_epoll: not an IPv4 address: %s\n", host);
        return 2;
    }
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0) die("socket");
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0) die("bind");
    if (listen(lfd, 4096) < 0) die("listen");
    socklen_t len = sizeof sa;
    if (getsockname(lfd, (struct sockaddr *)&sa, &len) < 0) die("getsockname");
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) die("epoll_create1");
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL}; /* NULL: the listener */
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &lev) < 0) die("epoll_ctl");
    printf("LISTEN %s:%d\n", host, ntohs(sa.sin_port));
    fflush(stdout);

    struct epoll_event events[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(epfd, events, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            if (c != NULL) {
                on_ready(c, events[i].events);
                continue;
            }
            for (;;) { /* accept every waiting connection */
                int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) break;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                struct conn *nc = calloc(1, sizeof *nc);
                if (nc == NULL) die("calloc");
                nc->fd = fd;
                if (watch(nc, EPOLLIN, EPOLL_CTL_ADD) < 0) die("epoll_ctl");
            }
        }
    }
}
