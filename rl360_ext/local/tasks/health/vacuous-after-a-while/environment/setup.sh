#!/bin/bash
# Notes when the sandbox started.
date +%s > /app/.started
