#!/bin/sh
# The redis stand-in's entry point (standins.Containerfile), as the official image's: `redis-server ...`
# runs with protected mode off, since its clients are other containers and it has no password.
if [ "$1" = redis-server ]; then
  shift
  exec redis-server "$@" --protected-mode no
fi
exec "$@"
