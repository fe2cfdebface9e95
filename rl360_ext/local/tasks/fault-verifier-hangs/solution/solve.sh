#!/bin/bash
set -e
echo done > /app/done.txt
