#!/bin/bash
# Simulates a build that hangs on a registry pull.
sleep 3600
